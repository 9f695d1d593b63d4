"""The documentation as tests read it: the README (the newcomer's page) and the MkDocs pages under
docs/, where the reference tables (configuration fields, CLI, metrics) and the examples that
moved out of the README live. Tests run examples exactly as a reader would copy them, and check
the tables against the code."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
CONFIGURATION = DOCS / "operating" / "configuration.md"
CLI = DOCS / "operating" / "cli.md"
METRICS = DOCS / "operating" / "metrics.md"
ROLLOUT = DOCS / "architecture" / "rollout.md"


def page(path: Path | str) -> str:
    """A page's text; a relative path is taken from the repository root (`docs/...`)."""
    path = Path(path)
    return (path if path.is_absolute() else REPO_ROOT / path).read_text(encoding="utf-8")


def code_block(path: Path | str, heading: str, language: str) -> str:
    """The first ```language block after the line `heading` (a whole Markdown heading line)."""
    lines = page(path).splitlines()
    start = lines.index(heading)
    opening = lines.index("```" + language, start)
    closing = lines.index("```", opening + 1)
    return "\n".join(lines[opening + 1 : closing]) + "\n"


def _table_names(path: Path, prefix: str) -> set[str]:
    """The names in the first cell of each table row starting with `prefix`. A row may name
    several: `a_b_c` / `_d` / `x`: alternatives starting with `_` replace as many trailing words
    of the first name as the first such alternative has (`_max` of `backoff_initial` is
    `backoff_max`; `_active_info` / `_last_known_good_info` of `config_assigned_info` are
    `config_active_info` and `config_last_known_good_info`); one with a dot is a full name; any
    other replaces the first name's last dotted part."""
    names = set()
    for line in page(path).splitlines():
        if not line.startswith("| `" + prefix):
            continue
        first, *others = re.findall(r"`([A-Za-z0-9_.]+)`", line.split("|")[1])
        names.add(first)
        head = first.rpartition(".")[0]
        cut = next((o.count("_") for o in others if o.startswith("_")), 0)
        for other in others:
            if other.startswith("_"):
                names.add("_".join(first.split("_")[:-cut]) + other)
            elif "." in other:
                names.add(other)
            else:
                names.add(f"{head}.{other}" if head else other)
    return names


def documented_metrics() -> set[str]:
    """Names in the table of docs/operating/metrics.md."""
    return _table_names(METRICS, "nodeagent_")


def documented_config_fields() -> set[str]:
    """`section.field` names in the table of docs/operating/configuration.md."""
    return {name for name in _table_names(CONFIGURATION, "") if "." in name}


def documented_rollout_fields() -> set[str]:
    """`spec.rollout.*` and `status.*` NodeAgentConfig fields in the tables of
    docs/architecture/rollout.md."""
    return _table_names(ROLLOUT, "spec.rollout.") | _table_names(ROLLOUT, "status.")
