"""The upstream CDI library reading CDI spec files, for tests.

Standard library only. The Go side lives in ``tests/harness/cdicheck`` (one binary, ``cdicheck``,
built on ``tags.cncf.io/container-device-interface`` at the version containerd v2.4.2 uses,
unchanged); it is built by ``tests/harness/cdicheck/build.sh`` into a cache directory keyed by the
hash of its sources, so only the first run on a machine pays for the build, and a test that needs
it builds it on demand. Each call is one short process (about 10 ms)::

    result = validate(path)  # {"minimumVersion": "0.5.0", "version": "0.5.0", "error": ""}
    oci = inject(spec_dir, ["k8s.gpu.example.com/device=gpu-0"])  # the OCI spec, edited
    oci["process"]["env"], oci["linux"]["devices"], oci["mounts"]

Environment:
    NODEAGENT_CDICHECK_BIN    use this binary instead of building one
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.support.gobuild import GoBinary

__all__ = [
    "CdiCheckBuildError",
    "CdiInjectError",
    "build_cdicheck",
    "inject",
    "validate",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "tests" / "harness" / "cdicheck" / "build.sh"
TIMEOUT = 60.0


class CdiCheckBuildError(RuntimeError):
    """build.sh failed; the message carries its output."""


class CdiInjectError(RuntimeError):
    """The library could not inject the devices; `result` is cdicheck's JSON (``error``,
    ``unresolved``, ``specErrors``: path -> the errors of the spec files it refused)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(json.dumps(result, indent=2))
        self.result = result


_BINARY = GoBinary(BUILD_SH, "NODEAGENT_CDICHECK_BIN", CdiCheckBuildError)


def build_cdicheck() -> pathlib.Path:
    """Run tests/harness/cdicheck/build.sh (a no-op when cached); return the binary path."""
    return _BINARY.path()


def _run(*args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [str(build_cdicheck()), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(
            f"cdicheck {' '.join(args)}: exit {proc.returncode}, not JSON on stdout\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        ) from exc
    if not isinstance(result, dict):
        raise RuntimeError(f"cdicheck {' '.join(args)}: printed {proc.stdout[-4000:]}")
    return proc.returncode, result


def validate(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The spec file as the library's cache reads it (``cdi.ReadSpec``): ``error`` is empty if
    it is valid; ``minimumVersion`` is specs-go's ``MinimumRequiredVersion`` of the parsed spec
    and ``version`` its ``cdiVersion`` (both empty if it does not parse)."""
    code, result = _run("validate", os.fspath(path))
    if code != 0:
        raise RuntimeError(f"cdicheck validate {path}: exit {code}: {result}")
    return result


def inject(spec_dir: str | os.PathLike[str], ids: Sequence[str]) -> dict[str, Any]:
    """The OCI spec (runtime-spec JSON) after a cache over `spec_dir` injected the qualified
    device IDs into an empty one (``{"process": {}, "linux": {}}``); CdiInjectError if a device
    does not resolve or the edits fail (a device node the host does not have)."""
    code, result = _run("inject", "--spec-dir", os.fspath(spec_dir), *ids)
    if code != 0:
        raise CdiInjectError(result)
    return result
