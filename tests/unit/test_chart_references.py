"""The Helm chart's comments and descriptions (and the monitoring files it ships) send readers only
to places that exist (issue 30 item 4): every repository path they cite is there, and a README
section they name is a heading of the README (its reference sections moved to docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "nodeagent"
FILES = sorted(
    p
    for p in [*CHART.rglob("*"), *(REPO_ROOT / "deploy" / "monitoring").iterdir()]
    if p.is_file() and p.suffix in (".yaml", ".json", ".tpl", ".txt")
)
# A path into the repository: its first folder and what follows, up to white space or a quote.
PATH = re.compile(r"\b(?:deploy|docs|tests|scripts|python|examples|benches)/[\w./-]*")
# README "Section", also across a comment's line break, also escaped in JSON.
README_SECTION = re.compile(r"README\s+(?:#\s*)?\\?\"([^\"\\]+)\\?\"")


def _headings() -> set[str]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_what_the_chart_cites_exists(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    cited = {m.group(0).rstrip(".,;:") for m in PATH.finditer(text)}
    missing = sorted(c for c in cited if not (REPO_ROOT / c).exists())
    assert not missing, f"{path.name} cites paths that do not exist: {missing}"
    headings = _headings()
    sections = sorted({s for s in README_SECTION.findall(text) if s not in headings})
    assert not sections, f"{path.name} names README sections that do not exist: {sections}"
