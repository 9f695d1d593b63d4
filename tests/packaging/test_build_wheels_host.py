"""scripts/build-wheels for the build machine only (`--host`, or NODEAGENT_WHEEL_TARGETS=host):
one wheel, for the triple `rustc -vV` names, and no rustup at all, so a machine without rustup's
download server (or with Debian's cargo, which has no rustup) builds what it can run (issue 29
item 17: the default reached for rustup to add aarch64). Without --host, a missing target with
no way to add it says to use --host. The script runs as it is, with stand-ins for the Rust
toolchain and the wheel tools (maturin, auditwheel, twine), so nothing is built."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-wheels"
HOST = "x86_64-unknown-linux-gnu"

MATURIN = r"""#!/bin/sh
cmd=$1; shift; target=; out=
while [ $# -gt 0 ]; do
  case $1 in --target) target=$2; shift ;; --out) out=$2; shift ;; esac
  shift
done
echo "$cmd $target" >>"$LOG"
if [ "$cmd" = build ]; then
  touch "$out/nodeagent-0.1.0-cp311-abi3-manylinux_2_28_${target%%-*}.whl"
else
  touch "$out/nodeagent-0.1.0.tar.gz"
fi
"""
AUDITWHEEL = r"""#!/bin/sh
arch=${2%.whl}; arch=${arch##*_2_28_}
echo "This wheel is consistent with the following platform tag: \"manylinux_2_28_$arch\"."
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _env(tmp_path: Path) -> dict[str, str]:
    """Stand-ins: rustc knows the host, rustup cannot reach its server, the wheel tools' venv is
    there with the pinned versions."""
    bin_, log = tmp_path / "bin", tmp_path / "log"
    _executable(bin_ / "rustc", f"#!/bin/sh\necho 'rustc 1.90.0'\necho 'host: {HOST}'\n")
    _executable(bin_ / "cargo", "#!/bin/sh\necho 'cargo 1.90.0'\n")
    _executable(
        bin_ / "rustup",
        f"#!/bin/sh\necho \"rustup $*\" >>{log}\necho 'error: could not download' >&2\nexit 1\n",
    )
    tools = tmp_path / "cache" / "nodeagent" / "wheel-tools"
    (pins,) = re.findall(r"^tool_pins=\((.*)\)$", SCRIPT.read_text(), re.M)
    tools.mkdir(parents=True)
    (tools / ".pins").write_text(pins + "\n")
    _executable(tools / "bin" / "python", "#!/bin/sh\ncat >/dev/null\n")
    _executable(tools / "bin" / "maturin", MATURIN)
    _executable(tools / "bin" / "auditwheel", AUDITWHEEL)
    _executable(tools / "bin" / "twine", "#!/bin/sh\n")
    env = {k: v for k, v in os.environ.items() if k != "NODEAGENT_WHEEL_TARGETS"}
    return env | {
        "PATH": f"{bin_}:/usr/bin:/bin",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "NODEAGENT_DIST": str(tmp_path / "dist"),
        "LOG": str(log),
    }


def _build(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("how", ["--host", "NODEAGENT_WHEEL_TARGETS=host"])
def test_host_only_builds_the_hosts_wheel_without_rustup(tmp_path: Path, how: str) -> None:
    env = _env(tmp_path)
    args: list[str] = []
    if how == "--host":
        args.append(how)
    else:
        env |= dict([how.split("=")])
    answer = _build(env, *args)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    built = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert built == [
        "nodeagent-0.1.0-cp311-abi3-manylinux_2_28_x86_64.whl",
        "nodeagent-0.1.0.tar.gz",
    ]
    assert (tmp_path / "log").read_text().splitlines() == [f"build {HOST}", "sdist "]


def test_a_target_rustup_cannot_add_names_the_way_out(tmp_path: Path) -> None:
    answer = _build(_env(tmp_path))
    assert answer.returncode != 0
    assert "aarch64-unknown-linux-gnu" in answer.stderr
    assert "bash scripts/build-wheels --host" in answer.stderr, answer.stderr
