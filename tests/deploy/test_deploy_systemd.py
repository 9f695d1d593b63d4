"""The shipped systemd unit checked by systemd's own tools (Debian's `systemd`, >= 252 for
`security --offline`): `systemd-analyze verify` finds nothing to say, and the exposure score of
`systemd-analyze security --offline=yes` is no higher than the one the docs state
(docs/operating/systemd.md)."""

from __future__ import annotations

import configparser
import pathlib
import re
import shutil
import subprocess
import sys

from tests.support.crds import REPO_ROOT

UNIT = REPO_ROOT / "deploy" / "systemd" / "nodeagent.service"
SYSTEMD_PAGE = REPO_ROOT / "docs" / "operating" / "systemd.md"
# verify checks that ExecStart's program exists: a private mount namespace gets a tmpfs over
# /usr/local/bin with the venv's console script in it, where the docs install it; the host's
# /usr/local/bin is untouched.
VERIFY_WITH_BINARY = """set -e
mount -t tmpfs nodeagent-test /usr/local/bin
cp "$1" /usr/local/bin/nodeagent
exec systemd-analyze verify "$2"
"""


def _verify(unit: pathlib.Path) -> subprocess.CompletedProcess[str]:
    script = pathlib.Path(sys.executable).with_name("nodeagent")
    namespace = ["unshare", "--mount", "--propagation", "private"]
    return subprocess.run(
        [*namespace, "sh", "-c", VERIFY_WITH_BINARY, "verify", str(script), str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def documented_score() -> float:
    match = re.search(r"exposure score[^*\n]*\*\*(\d+\.\d)\*\*", SYSTEMD_PAGE.read_text())
    assert match, "docs/operating/systemd.md states the unit's exposure score as **N.N**"
    return float(match[1])


def exposure(unit: pathlib.Path) -> tuple[float, str]:
    answer = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", answer.stdout)
    assert match, answer.stdout + answer.stderr
    return float(match[1]), answer.stdout


def test_the_unit_verifies_clean() -> None:
    answer = _verify(UNIT)
    assert (answer.returncode, answer.stdout + answer.stderr) == (0, "")


def test_verify_reports_what_systemd_would_ignore(tmp_path: pathlib.Path) -> None:
    # verify exits 0 on an unknown key or a bad value (systemd ignores the line): the test above
    # relies on its output being empty, so show that such a unit does print.
    unit = tmp_path / "nodeagent.service"
    unit.write_text(UNIT.read_text().replace("Type=notify", "Type=notfy\nWatchdogSecs=30s"))
    answer = _verify(unit)
    assert "Failed to parse service type" in answer.stderr
    assert "Unknown key 'WatchdogSecs'" in answer.stderr


def test_the_exposure_score_is_no_higher_than_documented() -> None:
    score, report = exposure(UNIT)
    assert score <= documented_score(), report
    assert documented_score() == 1.6


def test_a_loosened_unit_scores_higher(tmp_path: pathlib.Path) -> None:
    # The score is sensitive to the hardening (what the test above guards).
    unit = tmp_path / "nodeagent.service"
    unit.write_text(UNIT.read_text().replace("CapabilityBoundingSet=\n", ""))
    assert exposure(unit)[0] > documented_score()


def test_the_unit_keeps_notify_watchdog_and_reload() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    service = parser["Service"]
    assert service["Type"] == "notify"
    assert service["WatchdogSec"] == "30s"
    assert service["NotifyAccess"] == "main"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["ExecStart"].startswith("/usr/local/bin/nodeagent run")
    assert shutil.which("systemd-analyze"), "scripts/deploy-tools installs systemd"
