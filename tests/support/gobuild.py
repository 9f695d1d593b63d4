"""Go test binaries built by a `build.sh` that caches them by the hash of their sources and
prints the binary's path on its last line (tests/harness/*/build.sh). Stdlib only."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import threading
from collections.abc import Sequence


class GoBinary:
    """One such binary: built at most once per process, or taken from `override_env` (None: never
    overridden). `args` go to build.sh (the harness takes the Kubernetes release)."""

    def __init__(
        self,
        build_sh: pathlib.Path,
        override_env: str | None,
        error: type[Exception],
        args: Sequence[str] = (),
    ) -> None:
        self.build_sh = build_sh
        self.override_env = override_env
        self.args = tuple(args)
        self.error = error
        self._lock = threading.Lock()
        self._built: pathlib.Path | None = None

    def path(self) -> pathlib.Path:
        """Run build.sh (a no-op when cached) and return the binary's path."""
        override = os.environ.get(self.override_env) if self.override_env else None
        if override:
            path = pathlib.Path(override)
            if not os.access(path, os.X_OK):
                raise self.error(f"{self.override_env}={override} is not an executable")
            return path
        with self._lock:
            if self._built is None or not self._built.exists():
                self._built = self._build()
            return self._built

    def _build(self) -> pathlib.Path:
        env = dict(os.environ)
        if shutil.which("go", path=env.get("PATH")) is None and os.access(
            "/usr/local/go/bin/go", os.X_OK
        ):
            env["PATH"] = "/usr/local/go/bin" + os.pathsep + env.get("PATH", "")
        proc = subprocess.run(
            ["bash", str(self.build_sh), *self.args],
            cwd=self.build_sh.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        if proc.returncode != 0 or not lines:
            raise self.error(
                f"{self.build_sh} failed (exit {proc.returncode})\n"
                f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
            )
        path = pathlib.Path(lines[-1].strip())
        if not os.access(path, os.X_OK):
            raise self.error(f"{self.build_sh} printed {path}, which is not an executable")
        return path
