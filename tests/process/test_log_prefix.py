"""`nodeagent run` prefixes its log lines with the syslog priority only when stderr is journald's
stream: $JOURNAL_STREAM names that stream's device:inode, and a terminal or file started from
a systemd service inherits the variable without the stream."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.process.conftest import NotifyListener, nodeagent_command


def _run_to_ready_and_stop(tmp_path: Path, journal_stream: str | None, stderr_path: Path) -> str:
    notify = NotifyListener(tmp_path / "notify")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("JOURNAL_STREAM", None)
    env["NOTIFY_SOCKET"] = notify.path
    with stderr_path.open("a") as stderr:
        if journal_stream == "match":
            stat = os.fstat(stderr.fileno())
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
        elif journal_stream is not None:
            env["JOURNAL_STREAM"] = journal_stream
        command = nodeagent_command(
            "run", "--state-dir", str(tmp_path / "state"), "--ops-address", "127.0.0.1:0"
        )
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        notify.wait_for("READY")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
    return stderr_path.read_text()


def test_journald_stream_gets_priority_prefixes(tmp_path: Path) -> None:
    text = _run_to_ready_and_stop(tmp_path, "match", tmp_path / "stderr")
    lines = text.splitlines()
    assert lines and all(line.startswith(("<6>", "<4>", "<3>")) for line in lines), text
    assert any(line.startswith("<6>") and "configuration loaded" in line for line in lines)


@pytest.mark.parametrize("journal_stream", [None, "1:1", "garbage"])
def test_other_stderr_has_no_prefix(tmp_path: Path, journal_stream: str | None) -> None:
    # "1:1": inherited from a service whose journal stream is not our stderr (a terminal there).
    text = _run_to_ready_and_stop(tmp_path, journal_stream, tmp_path / "stderr")
    lines = text.splitlines()
    assert any("configuration loaded" in line for line in lines), text
    assert not any(line.startswith("<") for line in lines), text
