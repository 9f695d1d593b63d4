"""A running Go test binary (tests/harness/draplugin, tests/harness/draplugin-v037,
tests/harness/katalystplugin): its stderr in a log file, a polled wait that fails with the log's
tail, a SIGHUP reload of the JSON file it reads, SIGTERM/SIGKILL, and no process left behind when a
test dies. Stdlib only."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import signal
import subprocess
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, TextIO

STOP_TIMEOUT = 15.0


class GoProcess:
    """Base of the process wrappers; `label` names the binary in errors."""

    label: ClassVar[str] = "go test binary"

    def __init__(
        self, log_path: pathlib.Path, proc: subprocess.Popen[bytes], log_file: TextIO
    ) -> None:
        self.log_path = log_path
        self.proc = proc
        self._log_file = log_file
        _live.add(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait (the binaries remove their sockets). Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Make sure the process is gone (SIGKILL if needed) and the log file closed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()

    def _reload(
        self, path: pathlib.Path, value: Any, marker: str, what: str, timeout: float
    ) -> None:
        """Rewrite `path`, SIGHUP, and wait until the log shows `marker` once more."""
        before = self.log().count(marker)
        write_json(path, value)
        self.proc.send_signal(signal.SIGHUP)
        self._wait(lambda: self.log().count(marker) > before, what, timeout)

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited ({self.proc.returncode}) waiting for {what}:\n"
                    + self.log()[-4000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.label}: no {what} within {timeout}s:\n{self.log()[-4000:]}"
                )
            time.sleep(0.02)


# A test that dies between start and close must not leave the process running.
_live: weakref.WeakSet[GoProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        process.close()


def write_json(path: pathlib.Path, value: Any) -> None:
    # Atomic: the process never reads a half-written file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
