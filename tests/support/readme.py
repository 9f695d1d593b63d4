"""The README's code examples, so tests can run them exactly as a reader would copy them."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block(heading: str) -> str:
    """The first ```python block after the line `heading` (a whole Markdown heading line)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    opening = lines.index("```python", start)
    closing = lines.index("```", opening + 1)
    return "\n".join(lines[opening + 1 : closing]) + "\n"
