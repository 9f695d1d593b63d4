"""What the CNR writer would write, given the merge and the observed object."""

from __future__ import annotations

from typing import Any

from nodeagent.reporter.cnr import FIELD_MANAGER, write_plan
from nodeagent.reporter.merge import MergeResult


def merged(body: dict[str, Any]) -> MergeResult:
    return MergeResult(body, frozenset(), ())


def observed(
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    owned_status: list[str] = (),  # type: ignore[assignment]
    owned_labels: list[str] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    managed = []
    if owned_labels:
        managed.append(
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in owned_labels}}},
            }
        )
    if owned_status:
        managed.append(
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "subresource": "status",
                "fieldsV1": {"f:status": {f"f:{k}": {} for k in owned_status}},
            }
        )
    return {
        "metadata": {"name": "n", "labels": labels or {}, "managedFields": managed},
        "status": status or {},
    }


def verbs(plan: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [v for v, _ in plan]


def test_missing_cnr_is_created_then_applied() -> None:
    plan = write_plan("n", merged({"status": {"topologyPolicy": "None"}}), None)
    assert verbs(plan) == ["create", "status"]
    assert plan[1][1]["status"] == {"topologyPolicy": "None"}


def test_nothing_to_write_when_the_server_matches_quantities_by_value() -> None:
    body = {"status": {"resources": {"allocatable": {"cpu": "1"}}}}
    have = observed(
        status={"resources": {"allocatable": {"cpu": "1000m"}}, "topologyPolicy": "none"},
        owned_status=["resources"],
    )
    assert write_plan("n", merged(body), have) == []


def test_labels_compared_as_text() -> None:
    body = {"metadata": {"labels": {"a": "1"}}}
    have = observed(labels={"a": "1.0"}, owned_labels=["a"])
    assert verbs(write_plan("n", merged(body), have)) == ["apply"]


def test_a_field_owned_and_no_longer_reported_is_applied_away() -> None:
    have = observed(
        status={"topologyZone": [{"type": "Numa", "name": "0"}]}, owned_status=["topologyZone"]
    )
    plan = write_plan("n", merged({}), have)
    assert verbs(plan) == ["status"]
    assert "status" not in plan[0][1]
    # Another manager's field is not ours to remove: nothing to write.
    assert (
        write_plan("n", merged({}), observed(status={"conditions": [{"type": "AgentReady"}]})) == []
    )
