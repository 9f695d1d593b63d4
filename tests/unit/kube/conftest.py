from __future__ import annotations

import pytest

from tests.support.fake_http_apiserver import FakeCluster


@pytest.fixture
def fake() -> FakeCluster:
    return FakeCluster()
