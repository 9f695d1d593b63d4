from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def registry() -> Iterator[Path]:
    # Short path: unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="na-unit-reg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
