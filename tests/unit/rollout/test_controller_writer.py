"""The status the controller writes: status.rollout and the RolledOut condition, merged into
what is stored, and nothing to write when the stored status already says it."""

from __future__ import annotations

import msgspec

from nodeagent.rollout.api import Phase, RolloutStatus
from nodeagent.rollout_controller.writer import status_document

STATUS = RolloutStatus(config_hash="h", generation=1, observed_generation=2, admitted=1)


def test_a_new_status_is_written_with_its_condition_and_keeps_the_rest() -> None:
    stored = {"other": 1, "conditions": [{"type": "Else", "status": "True"}]}
    doc = status_document(stored, STATUS, 2, 0.0)
    assert doc is not None
    assert doc["other"] == 1 and doc["rollout"] == msgspec.to_builtins(STATUS)
    types = [c["type"] for c in doc["conditions"]]
    assert types == ["Else", "RolledOut"]
    rolled = doc["conditions"][1]
    assert (rolled["status"], rolled["reason"], rolled["observedGeneration"]) == (
        "False",
        "Progressing",
        2,
    )
    assert rolled["lastTransitionTime"] == "1970-01-01T00:00:00Z"


def test_the_same_status_is_not_written_again() -> None:
    doc = status_document(None, STATUS, 2, 0.0)
    assert doc is not None
    # Through JSON, as the apiserver serves it back.
    served = msgspec.json.decode(msgspec.json.encode(doc))
    assert status_document(served, STATUS, 2, 100.0) is None


def test_the_transition_time_moves_only_when_the_condition_status_does() -> None:
    first = status_document(None, STATUS, 2, 0.0)
    progressed = msgspec.structs.replace(STATUS, admitted=2)
    second = status_document(first, progressed, 2, 50.0)
    assert second is not None and second["conditions"][0]["lastTransitionTime"].endswith("00Z")
    complete = msgspec.structs.replace(STATUS, phase=Phase.COMPLETE, message="complete")
    third = status_document(second, complete, 2, 60.0)
    assert third is not None
    (cond,) = third["conditions"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "True",
        "Complete",
        "1970-01-01T00:01:00Z",
    )


def test_an_unreadable_stored_rollout_is_replaced() -> None:
    stored = {"rollout": {"phase": 7}}
    assert status_document(stored, STATUS, 2, 0.0) is not None
