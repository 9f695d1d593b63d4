"""One apiserver (with its audit log) and both fault proxies for every fault scenario."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.env import FaultEnv


@pytest.fixture(scope="session")
def fault_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultEnv]:
    with FaultEnv.start(tmp_path_factory.mktemp("faults")) as env:
        yield env
