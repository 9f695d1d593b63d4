"""Which fields of a written ResourceSlice spec the API server did not store, and the feature
gate that most likely made it drop them.

kube-apiserver silently drops the fields of a disabled DRA feature gate on create and update
(`pkg/registry/resource/resourceslice/strategy.go`, `dropDisabledFields`) and answers 201/200
with what it kept. The publisher compares what it sent with the answer and tells the operator
which fields are missing (`dropped_fields`); the gates are those of kube-apiserver v1.37.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FIELD_GATES", "dropped_fields", "likely_gate", "present_fields"]

# Field path (list elements and map values elided) -> the gate that drops it when off.
FIELD_GATES: Mapping[str, str] = {
    "devices.taints": "DRADeviceTaints",
    "sharedCounters": "DRAPartitionableDevices",
    "devices.consumesCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "devices.nodeName": "DRAPartitionableDevices",
    "devices.nodeSelector": "DRAPartitionableDevices",
    "devices.allNodes": "DRAPartitionableDevices",
    # Kept only with both gates on.
    "devices.bindingConditions": "DRADeviceBindingConditions+DRAResourceClaimDeviceStatus",
    "devices.bindingFailureConditions": "DRADeviceBindingConditions+DRAResourceClaimDeviceStatus",
    "devices.bindsToNode": "DRADeviceBindingConditions+DRAResourceClaimDeviceStatus",
    "devices.allowMultipleAllocations": "DRAConsumableCapacity",
    "devices.capacity.requestPolicy": "DRAConsumableCapacity",
    "devices.consumesCounters.compatibilityGroups": "DRADeviceCompatibilityGroups",
    "devices.nodeAllocatableResources": "DRANodeAllocatableResources",
    "devices.attributes.bools": "DRAListTypeAttributes",
    "devices.attributes.ints": "DRAListTypeAttributes",
    "devices.attributes.strings": "DRAListTypeAttributes",
    "devices.attributes.versions": "DRAListTypeAttributes",
    "partitionTypeAttribute": "DRAPartitionableDevicesType",
    "skipNodeOperations": "DRAOptionalNodeOperations",
}

# Objects whose keys are names chosen by the driver, not field names: elided from the path so
# that a metric label stays one of a few values.
_NAMED_MAPS = frozenset({"attributes", "capacity", "counters", "nodeAllocatableResources"})


def likely_gate(field: str) -> str:
    """The feature gate that drops `field` when off ("" when none is known)."""
    return FIELD_GATES.get(field, "")


def _empty(v: Any) -> bool:
    # What the server omits: an unset pointer, an empty list or map (false is a value).
    return v is None or v == [] or v == {} or v == ""


def _walk(sent: Any, stored: Any, path: str, named: bool) -> Iterator[str]:
    if isinstance(sent, dict):
        got = stored if isinstance(stored, dict) else {}
        for key, value in sent.items():
            if _empty(value):
                continue
            here = path if named else (f"{path}.{key}" if path else key)
            if key not in got or _empty(got[key]):
                yield here
            else:
                yield from _walk(value, got[key], here, not named and key in _NAMED_MAPS)
    elif isinstance(sent, list):
        got_list = stored if isinstance(stored, list) else []
        for i, value in enumerate(sent):
            if i < len(got_list):
                yield from _walk(value, got_list[i], path, False)


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The fields set in `sent` (a ResourceSlice spec) that `stored` lacks, sorted, as paths
    with list indices and driver-chosen names left out (``devices.taints``, ``sharedCounters``,
    ``devices.capacity.requestPolicy``). Values that differ but are present (a quantity spelled
    another way) are not dropped fields."""
    return sorted(set(_walk(dict(sent), dict(stored), "", False)))


def present_fields(sent: Mapping[str, Any]) -> list[str]:
    """Every field path set in `sent`, in the notation of `dropped_fields`."""
    out: set[str] = set()

    def walk(v: Any, path: str, named: bool) -> None:
        if isinstance(v, dict):
            for key, value in v.items():
                if _empty(value):
                    continue
                here = path if named else (f"{path}.{key}" if path else key)
                out.add(here)
                walk(value, here, not named and key in _NAMED_MAPS)
        elif isinstance(v, list):
            for item in v:
                walk(item, path, False)

    walk(dict(sent), "", False)
    out.discard("")
    return sorted(out)
