"""The package metadata agrees with itself: one version, the Pythons claimed, the license.

The built artifacts themselves are checked by scripts/smoke-wheel (CI): auditwheel, installs in
clean venvs, `nodeagent --version` against the wheel's version.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

import nodeagent

ROOT = Path(__file__).resolve().parents[2]


def _toml(path: str) -> dict[str, object]:
    with (ROOT / path).open("rb") as f:
        return tomllib.load(f)


def _project() -> dict[str, object]:
    project = _toml("pyproject.toml")["project"]
    assert isinstance(project, dict)
    return project


def _cargo_version() -> str:
    package = _toml("rust/Cargo.toml")["package"]
    assert isinstance(package, dict)
    return str(package["version"])


def _claimed_minors() -> set[str]:
    classifiers = _project()["classifiers"]
    assert isinstance(classifiers, list)
    prefix = "Programming Language :: Python :: 3."
    return {
        c.removeprefix("Programming Language :: Python :: ")
        for c in classifiers
        if c.startswith(prefix) and c[len(prefix) :].isdigit()
    }


def _allowed_minors() -> set[str]:
    spec = SpecifierSet(str(_project()["requires-python"]))
    return {f"3.{minor}" for minor in range(0, 30) if Version(f"3.{minor}.0") in spec}


def test_version_is_written_only_in_cargo_toml() -> None:
    project = _project()
    assert "version" not in project and "version" in project["dynamic"]  # type: ignore[operator]
    version = _cargo_version()
    assert importlib.metadata.version("nodeagent") == version
    assert nodeagent.__version__ == version
    # No second copy of it in the package sources or the project file.
    for path in [ROOT / "pyproject.toml", *(ROOT / "python" / "nodeagent").rglob("*.py")]:
        text = path.read_text()
        assert f'"{version}"' not in text and f"'{version}'" not in text, path


def test_python_classifiers_match_requires_python() -> None:
    assert _claimed_minors() == _allowed_minors() == {"3.11", "3.12", "3.13", "3.14", "3.15"}


def test_the_first_minor_after_the_range_is_refused_by_requires_python() -> None:
    # What pip checks before installing: scripts/smoke-wheel proves the refusal with a real
    # interpreter when a Debian suite ships one (none ships 3.16 yet), this on the metadata.
    spec = SpecifierSet(str(_project()["requires-python"]))
    newest = max(int(minor.split(".")[1]) for minor in _claimed_minors())
    assert Version(f"3.{newest}.99") in spec
    for refused in (f"3.{newest + 1}.0", f"3.{newest + 1}.0rc1", "3.10.12"):
        assert not spec.contains(refused, prereleases=True), refused


def test_trio_asyncio_and_greenlet_are_not_dependencies() -> None:
    # trio-asyncio does not import on CPython >= 3.14; the bridge needs neither it nor greenlet.
    requires = importlib.metadata.requires("nodeagent") or []
    names = {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower() for r in requires}
    assert not names & {"trio-asyncio", "trio_asyncio", "greenlet"}, requires


def test_run_script_accepts_exactly_the_claimed_pythons() -> None:
    # scripts/run picks an interpreter before pip would refuse one: same range.
    text = (ROOT / "scripts" / "run").read_text()
    match = re.search(r"\(3, (\d+)\) <= sys.version_info\[:2\] < \(3, (\d+)\)", text)
    assert match, "scripts/run's supported-Python test not found"
    low, high = int(match.group(1)), int(match.group(2))
    assert {f"3.{m}" for m in range(low, high)} == _allowed_minors()


def test_license_is_apache_2_with_its_text() -> None:
    project = _project()
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    package = _toml("rust/Cargo.toml")["package"]
    assert isinstance(package, dict) and package["license"] == "Apache-2.0"


def test_wheel_build_pins_satisfy_the_build_system() -> None:
    build_system = _toml("pyproject.toml")["build-system"]
    assert isinstance(build_system, dict)
    (requirement,) = build_system["requires"]
    name, _, spec = requirement.partition(">")
    pinned = re.search(r"maturin==([\d.]+)", (ROOT / "scripts" / "build-wheels").read_text())
    assert name == "maturin" and pinned
    assert Version(pinned.group(1)) in SpecifierSet(">" + spec)
