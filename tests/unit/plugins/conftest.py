from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def registry(registry: str) -> Path:
    """The shared registry directory (tests/conftest.py) as a Path: this suite's tests join
    socket names onto it."""
    return Path(registry)
