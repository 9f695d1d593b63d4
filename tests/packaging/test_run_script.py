"""scripts/run re-installs the checkout into its venv only when a source changed: what
`scripts/setup` (an editable install: maturin writes the extension into `python/nodeagent/`) and
any import (`__pycache__/`) leave in the tree is no change (issue 29 item 18: every run after a
setup re-installed, the extension built again). The script runs on a copy of itself in a
small tree with a stand-in venv (its python records the install, its nodeagent answers), so
nothing is built."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    "rust/src/lib.rs",
    "rust/Cargo.toml",
    "rust/Cargo.lock",
    "python/nodeagent/__init__.py",
    "pyproject.toml",
]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _tree(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    repo, venv, tools = tmp_path / "repo", tmp_path / "venv", tmp_path / "tools"
    for name in ("run", "cargo-env.sh"):
        (repo / "scripts").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    for path in SOURCES:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("# source\n")
    log = tmp_path / "installs"
    _executable(venv / "bin" / "python", f'#!/bin/sh\necho "$@" >>{log}\n')
    _executable(venv / "bin" / "nodeagent", '#!/bin/sh\necho "nodeagent $*"\n')
    _executable(tools / "cargo", "#!/bin/sh\necho 'cargo 1.90.0 (stand-in)'\n")
    env = {
        **os.environ,
        "NODEAGENT_RUN_VENV": str(venv),
        "PYTHON": sys.executable,
        "PATH": f"{tools}:{os.environ['PATH']}",
    }
    return repo, log, env


def _run(repo: Path, env: dict[str, str]) -> str:
    answer = subprocess.run(
        ["bash", str(repo / "scripts" / "run"), "--log-level", "debug"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert answer.stdout == "nodeagent run --log-level debug\n"
    return answer.stderr


def _age(repo: Path, env: dict[str, str]) -> None:
    """The tree as of two minutes ago, installed a minute ago: whatever is written now is
    newer than the install."""
    now = os.stat(repo).st_mtime
    for path in repo.rglob("*"):
        os.utime(path, (now - 120, now - 120))
    stamp = Path(env["NODEAGENT_RUN_VENV"]) / ".nodeagent-installed"
    os.utime(stamp, (now - 60, now - 60))


def test_build_outputs_in_the_tree_do_not_reinstall(tmp_path: Path) -> None:
    repo, log, env = _tree(tmp_path)
    assert "installing nodeagent" in _run(repo, env)
    assert log.read_text().count("pip install") == 1
    _age(repo, env)
    # What scripts/setup's editable install and the tests' imports leave behind.
    package = repo / "python" / "nodeagent"
    (package / "_native.abi3.so").write_bytes(b"\x7fELF")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"")
    (repo / "rust" / "src" / "__pycache__").mkdir()
    assert "installing" not in _run(repo, env)
    assert log.read_text().count("pip install") == 1


def test_a_changed_source_reinstalls(tmp_path: Path) -> None:
    repo, log, env = _tree(tmp_path)
    _run(repo, env)
    for path in ("python/nodeagent/__init__.py", "python/nodeagent/py.typed", "rust/src/lib.rs"):
        _age(repo, env)
        (repo / path).write_text("# changed\n")
        assert "installing nodeagent" in _run(repo, env), path
    assert log.read_text().count("pip install") == 4
