"""The CI subset of the fault matrix (`python -m tests.faults.matrix` runs all of it): each
fault survived, nothing lost or duplicated, no write storm, recovery within the bound."""

from __future__ import annotations

import math

import pytest

from tests.faults.env import FaultEnv
from tests.faults.scenarios import SCENARIOS, Scenario, run

FAST = [s for s in SCENARIOS if s.fast]


@pytest.mark.integration
@pytest.mark.parametrize("scenario", FAST, ids=[s.name for s in FAST])
def test_fault_is_survived(fault_env: FaultEnv, scenario: Scenario) -> None:
    result = run(fault_env, scenario)
    assert (result.lost, result.duplicated) == (0, 0), result
    assert not math.isnan(result.recover_s) and result.recover_s <= scenario.bound, result
    assert result.extra_writes <= result.allowed_extra, result
    assert result.survived, result
