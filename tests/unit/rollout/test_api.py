"""The CRD's spec.rollout and status.rollout and the msgspec types the controller and agents
decode them with name the same fields, and the types read what the server stores."""

from __future__ import annotations

from typing import Any

import msgspec

from nodeagent.rollout.api import (
    Canary,
    Counts,
    FailurePolicy,
    Phase,
    RolloutSpec,
    RolloutStatus,
    decode_spec,
    decode_status,
)
from tests.unit.dynconfig.test_crd_schema import _crd


def _schema() -> dict[str, Any]:
    (version,) = _crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert isinstance(schema, dict)
    return schema


def _names(struct: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(struct)}


def test_spec_rollout_names_the_policys_fields() -> None:
    rollout = _schema()["spec"]["properties"]["rollout"]["properties"]
    assert set(rollout) == _names(RolloutSpec)
    assert set(rollout["canary"]["properties"]) == _names(Canary)
    assert set(rollout["failurePolicy"]["properties"]) == _names(FailurePolicy)


def test_status_rollout_names_the_statuss_fields_and_phases() -> None:
    rollout = _schema()["status"]["properties"]["rollout"]["properties"]
    assert set(rollout) == _names(RolloutStatus)
    assert set(rollout["counts"]["properties"]) == _names(Counts)
    assert rollout["phase"]["enum"] == [p.value for p in Phase]


def test_a_stored_policy_and_status_decode() -> None:
    spec = decode_spec(
        {
            "canary": {"percent": 5, "selector": {"matchLabels": {"canary": "yes"}}},
            "waves": [10, 100],
            "maxUnavailable": "10%",
            "pauseSeconds": 30,
            "failurePolicy": {"maxFailures": 2, "revert": True},
            "paused": True,
        }
    )
    assert spec.canary.percent == 5 and spec.waves == (10, 100) and spec.failure_policy.revert
    status = RolloutStatus(config_hash="abc", generation=2, phase=Phase.HALTED)
    assert decode_status(msgspec.to_builtins(status)) == status
    assert decode_status(None) is None
    assert decode_status({"phase": "Sideways"}) is None  # unreadable: start over, not guess
