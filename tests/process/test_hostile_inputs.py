"""`nodeagent run` / `status` / `check-config` as real processes, against hostile input: an
oversized plugin message, a plugin named with control characters, a closed stdout pipe,
config files that are not files, an early SIGHUP, an unusable state dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.process.conftest import START_TIMEOUT, AgentProcess, StartAgent, nodeagent_command
from tests.process.test_plugins import PLUGIN as POLITE_PLUGIN
from tests.process.test_plugins import wait_plugin

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "plugins" / "hostile_plugin.py"
ANNOUNCED = 400 * 1024 * 1024
# The agent's peak RSS may grow by at most this while a plugin announces 400 MB against the
# 4 MiB limit: one HTTP/2 window (4 MiB) plus the plugin's bookkeeping and allocator noise.
RSS_BOUND = 48 * 1024 * 1024
CONTROL_NAME = "evil\x1b[31m\rbell\x07"
RAW_CONTROLS = ("\x1b", "\r", "\x07")


def _vm(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


def _start_plugin(registry: Path, name: str, mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), str(registry), name, mode, str(ANNOUNCED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def _stop_plugin(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(10)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _sent(proc: subprocess.Popen[bytes]) -> int:
    """The body bytes the hostile plugin could send (its ``sent N`` line)."""
    assert proc.stdout is not None
    for line in proc.stdout:  # ends (and fails below) if the plugin exits
        if line.startswith(b"sent "):
            return int(line.split()[1])
    raise AssertionError("the hostile plugin exited without sending")


def _plugins(agent: AgentProcess) -> list[dict[str, object]]:
    doc: list[dict[str, object]] = json.loads(agent.get("/v1/plugins")[1])
    return doc


def _until(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_oversized_plugin_message_leaves_the_agents_memory_bounded(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    agent = start_agent("--registry-dir", str(registry), "--log-format", "json")
    agent.wait_ready()
    polite = subprocess.Popen([sys.executable, "-c", POLITE_PLUGIN, str(registry)])
    try:
        wait_plugin(agent, "cpu-reporter")
        baseline = _vm(agent.proc.pid, "VmHWM")
        hostile = _start_plugin(registry, "hostile", "stream")
        try:
            sent = _sent(hostile)

            def refused_and_reopened() -> bool:
                item = next((p for p in _plugins(agent) if p["name"] == "hostile"), None)
                return (
                    item is not None
                    and item["messages_rejected"] == 1
                    and ("after" in json.dumps(item["last_message"]))
                )

            _until(refused_and_reopened, "the oversized message refused, the stream reopened")
            growth = _vm(agent.proc.pid, "VmHWM") - baseline
            print(f"peak RSS growth {growth / 2**20:.1f} MiB, body bytes sent {sent}")
            assert growth < RSS_BOUND, f"peak RSS grew by {growth / 2**20:.1f} MiB"
            assert sent <= 4 * 1024 * 1024, sent
            metrics = agent.get("/metrics")[1]
            assert 'nodeagent_plugin_errors_total{kind="message_too_large"} 1.0' in metrics
            # The other plugin is still served, and the agent is healthy.
            assert wait_plugin(agent, "cpu-reporter")["state"] == "registered"
            assert agent.get("/healthz")[0] == 200
        finally:
            _stop_plugin(hostile)
    finally:
        polite.send_signal(signal.SIGTERM)
        polite.wait(10)
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 0


def test_control_characters_from_a_plugin_are_escaped_in_logs_and_status(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    agent = start_agent("--registry-dir", str(registry))
    agent.wait_ready()
    plugin = _start_plugin(registry, CONTROL_NAME, "none")
    try:
        _until(
            lambda: any(p["name"] == CONTROL_NAME for p in _plugins(agent)),
            "the plugin registered",
        )
        for extra in ([], ["--json"]):
            out = subprocess.run(
                nodeagent_command("status", "--ops-address", agent.ops_address, *extra),
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            assert not any(c in out.stdout for c in RAW_CONTROLS), repr(out.stdout)
            if extra:
                names = [p["name"] for p in json.loads(out.stdout)["plugins"]]
                assert CONTROL_NAME in names  # JSON escapes, a reader gets the name back
            else:
                assert "evil\\x1b[31m bell\\x07" in out.stdout  # \r is blank in a table cell
    finally:
        _stop_plugin(plugin)
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 0
    assert "plugin registered" in agent.stderr_text
    assert not any(c in agent.stderr_text for c in RAW_CONTROLS), "raw control in the log"
    assert "evil\\x1b[31m\\rbell\\x07" in agent.stderr_text


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a command whose stdout is a pipe nobody reads any more (`| head -1` once head
    exited), deterministically: the read end is closed before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            nodeagent_command(*args), stdout=write, stderr=subprocess.PIPE, text=True, timeout=30
        )
    finally:
        os.close(write)


def test_a_closed_stdout_pipe_ends_status_and_check_config_quietly(
    start_agent: StartAgent,
) -> None:
    agent = start_agent()
    agent.wait_ready()
    for args in (
        ("status", "--ops-address", agent.ops_address, "--json"),
        ("status", "--ops-address", agent.ops_address),
        ("check-config",),
    ):
        out = _run_into_closed_pipe(*args)
        assert out.returncode == 128 + signal.SIGPIPE, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 0


def test_config_inputs_that_are_not_files_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[agent]\nlog_level = "\xc3\x28"\n')
    cases = [
        ("/dev/zero", "'/dev/zero': must be a regular file"),
        (str(fifo), f"'{fifo}': must be a regular file"),
        (str(bad), f"'{bad}': not valid UTF-8: byte 0xc3 at byte offset 21 (line 2)"),
    ]
    for path, message in cases:
        for command in (["check-config", path], ["run", "--config", path]):
            # A hang (the old FIFO read) or a read to MemoryError (/dev/zero) fails the timeout.
            out = subprocess.run(
                nodeagent_command(*command), capture_output=True, text=True, timeout=30
            )
            assert out.returncode == 2, (command, out.stderr)
            assert out.stderr == f"nodeagent: invalid configuration: --config: {message}\n"


def test_sighup_while_starting_is_survived(start_agent: StartAgent) -> None:
    agent = start_agent()
    pid = agent.proc.pid
    # From the moment the process catches SIGHUP (its first line of `run`), send it again and
    # again until the agent is ready: none may kill it.
    deadline = time.monotonic() + START_TIMEOUT
    while not _catches(pid, signal.SIGHUP):
        assert agent.proc.poll() is None and time.monotonic() < deadline
    sent = 0
    while True:
        agent.notify.drain()
        if _ready(agent):
            break
        assert agent.proc.poll() is None, "killed by an early SIGHUP"
        assert time.monotonic() < deadline, "never ready"
        agent.signal(signal.SIGHUP)
        sent += 1
        time.sleep(0.01)  # a stream of signals, not synchronisation
    agent.wait_ready()
    assert agent.get("/healthz")[0] == 200
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 0
    assert sent >= 1
    assert "SIGHUP received while starting, before reloads were possible" in agent.stderr_text


def test_sigterm_while_starting_is_a_clean_stop(start_agent: StartAgent) -> None:
    """A SIGTERM from the CLI's first line on (seen as the held SIGHUP: both are held together)
    stops the agent cleanly, exit 0, before the agent's own receiver exists (issue 29 item 6: it
    killed the process, which a start that resumed a trial then took for a crash)."""
    agent = start_agent()
    pid = agent.proc.pid
    deadline = time.monotonic() + START_TIMEOUT
    # The CLI's first line catches SIGHUP (and now SIGTERM): the start has begun, the agent's
    # own receiver is still hundreds of milliseconds away (config, imports, boot).
    while not _catches(pid, signal.SIGHUP):
        assert agent.proc.poll() is None and time.monotonic() < deadline
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=START_TIMEOUT) == 0, agent.stderr_text
    # Nearly always the held signal ("SIGTERM (received while starting)"); on a machine slow
    # enough for this test to send it after the receiver took over, the ordinary stop: both clean.
    assert "shutting down" in agent.stderr_text and "stopped" in agent.stderr_text


def _catches(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _ready(agent: AgentProcess) -> bool:
    return any(fields.get("READY") == "1" for _, fields in agent.notify.messages)


def test_a_state_dir_that_cannot_be_used_exits_1_naming_it(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    in_the_way = tmp_path / "file"
    in_the_way.write_text("")
    agent = start_agent("--state-dir", str(in_the_way))
    assert agent.wait(timeout=START_TIMEOUT) == 1
    assert f"agent.state_dir {in_the_way} exists and is not a directory" in agent.stderr_text
    assert "Traceback" not in agent.stderr_text

    # An existing directory on a read-only mount (root ignores permission bits): the mount is
    # made in a private mount namespace that ends with the process.
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    command = nodeagent_command("run", "--state-dir", str(readonly), "--ops-address", "127.0.0.1:0")
    script = f'mount --bind -o ro "{readonly}" "{readonly}" && exec "$@"'
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    assert out.returncode == 1, out.stderr
    assert f"agent.state_dir {readonly} is not writable: Read-only file system" in out.stderr
    assert "Traceback" not in out.stderr
