"""The dropped-field paths: list elements and driver-chosen names elided, the outermost missing
field only, a value spelled otherwise not a dropped field."""

from __future__ import annotations

from typing import Any

from nodeagent.resources.dropped import FIELD_GATES, dropped_fields, likely_gate, present_fields

SENT: dict[str, Any] = {
    "driver": "d",
    "devices": [
        {
            "name": "a",
            "attributes": {"model": {"string": "x"}},
            "capacity": {"mem": {"value": "1Gi", "requestPolicy": {"default": "1"}}},
            "taints": [{"key": "k", "effect": "NoSchedule"}],
            "consumesCounters": [
                {"counterSet": "s", "counters": {"c": {"value": "1"}}, "compatibilityGroups": ["g"]}
            ],
        },
        {"name": "b", "allowMultipleAllocations": True},
    ],
    "sharedCounters": [],
}


def test_missing_fields_by_path() -> None:
    stored: dict[str, Any] = {
        "driver": "d",
        "devices": [
            {
                "name": "a",
                "attributes": {"model": {"string": "x"}},
                "capacity": {"mem": {"value": "1073741824"}},  # respelled: not dropped
                "consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}],
            },
            {"name": "b"},
        ],
    }
    assert dropped_fields(SENT, stored) == [
        "devices.allowMultipleAllocations",
        "devices.capacity.requestPolicy",
        "devices.consumesCounters.compatibilityGroups",
        "devices.taints",
    ]
    # The outermost only: with consumesCounters gone, its groups are not listed again.
    stored["devices"][0].pop("consumesCounters")
    assert "devices.consumesCounters" in dropped_fields(SENT, stored)
    assert "devices.consumesCounters.compatibilityGroups" not in dropped_fields(SENT, stored)
    assert dropped_fields(SENT, SENT) == []


def test_present_fields_and_gates() -> None:
    present = present_fields(SENT)
    assert "devices.capacity.requestPolicy" in present
    assert "sharedCounters" not in present  # empty: the server omits it too
    assert not any("mem" in p or "model" in p for p in present)  # names chosen by the driver
    for path in (
        "devices.taints",
        "sharedCounters",
        "devices.capacity.requestPolicy",
        "devices.bindingConditions",
    ):
        assert likely_gate(path) == FIELD_GATES[path]
    assert likely_gate("devices.unknown") == ""
