from __future__ import annotations

import pytest

from tests.unit.kube.kube_fakes import FakeCluster


@pytest.fixture
def fake() -> FakeCluster:
    return FakeCluster()
