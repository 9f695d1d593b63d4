"""Names a newcomer reads right (issue 30 item 4): no module is named after one of the parts'
packages. `plugins/reporter.py` beside the `reporter/` package sent readers of the CNR reporter
into the plugin handler and back; the handler of the reporter plugin type is
`plugins/reporter_plugin.py`."""

from __future__ import annotations

from pathlib import Path

import nodeagent

ROOT = Path(nodeagent.__file__).resolve().parent

# The supervised parts, each in one folder of its own.
PARTS = {"plugins", "resources", "reporter", "dynconfig"}


def test_no_module_is_named_after_a_part() -> None:
    clashes = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if path.stem in PARTS and path.parent.name != path.stem
    )
    assert clashes == []
