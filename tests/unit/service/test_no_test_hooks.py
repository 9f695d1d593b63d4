"""The product holds no test-only hooks (issue 30 item 4): no module of `nodeagent` reads a
test's environment variable; the process tests reach their hooks through test-only launchers
(tests/support/hooked_agent.py, tests/support/unready_agent.py)."""

from __future__ import annotations

from pathlib import Path

import nodeagent

ROOT = Path(nodeagent.__file__).resolve().parent


def test_no_module_of_the_product_reads_a_test_hook_variable() -> None:
    readers = [
        str(path.relative_to(ROOT))
        for path in sorted(ROOT.rglob("*.py"))
        if any(name in path.read_text() for name in ("NODEAGENT_DEBUG_", "NODEAGENT_TEST_"))
    ]
    assert readers == []
