"""The README's code examples, so tests can run them exactly as a reader would copy them.
(Examples on the docs/ pages: `tests.support.docs.code_block`.)"""

from __future__ import annotations

from tests.support.docs import README, code_block


def python_block(heading: str) -> str:
    """The first ```python block after the line `heading` (a whole Markdown heading line)."""
    return code_block(README, heading, "python")
