"""What a driver's prepare callback is given: the claim, with this driver's part of its allocation.

The kubelet sends only a claim's namespace, name and UID; the SDK reads the `resource.k8s.io/v1`
ResourceClaim and hands the author a `Claim`: the devices allocated from this driver (request,
pool, device, share ID, consumed capacity) and the opaque configuration meant for this driver,
from the DeviceClass (``FromClass``) and the claim (``FromClaim``), in the order the scheduler
recorded it (class first, then claim: a later entry overrides an earlier one, as in upstream
drivers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

__all__ = ["AllocatedDevice", "Claim", "ClaimRef", "OpaqueConfig"]


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it (all an unprepare gets: the claim may be gone)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque configuration entry for this driver. ``requests`` empty: every request."""

    source: Literal["FromClass", "FromClaim"]
    requests: tuple[str, ...]
    parameters: Any  # the JSON value the user wrote, decoded

    def applies_to(self, request: str) -> bool:
        """Whether this entry is for `request` ("req" or a subrequest "req/sub")."""
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver: `request` may be a subrequest ("req/sub")."""

    request: str
    pool: str
    device: str
    config: tuple[OpaqueConfig, ...] = ()  # the entries that apply to this device, in order
    share_id: str | None = None  # set when the device allows multiple allocations
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim allocated (partly) from this driver, as read from the API server."""

    namespace: str
    name: str
    uid: str
    devices: tuple[AllocatedDevice, ...]
    config: tuple[OpaqueConfig, ...]  # every entry of this driver, class ones first
    raw: Mapping[str, Any]  # the whole ResourceClaim object as JSON

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.name, self.uid)


class ClaimError(Exception):
    """The claim cannot be prepared as read (not allocated, replaced, malformed)."""


# The parts of resource.k8s.io/v1 ResourceClaim the SDK reads (msgspec ignores the rest).
class _Opaque(msgspec.Struct, kw_only=True):
    driver: str
    parameters: Any = None


class _Config(msgspec.Struct, kw_only=True):
    source: str = ""
    requests: list[str] = []
    opaque: _Opaque | None = None


class _Result(msgspec.Struct, kw_only=True):
    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool | None = None
    shareID: str | None = None
    consumedCapacity: dict[str, str] = {}


class _DeviceAllocation(msgspec.Struct, kw_only=True):
    results: list[_Result] = []
    config: list[_Config] = []


class _Allocation(msgspec.Struct, kw_only=True):
    devices: _DeviceAllocation | None = None


class _Status(msgspec.Struct, kw_only=True):
    allocation: _Allocation | None = None


class _Meta(msgspec.Struct, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class _ResourceClaim(msgspec.Struct, kw_only=True):
    metadata: _Meta
    status: _Status = msgspec.field(default_factory=_Status)


def parse_claim(data: bytes, driver: str, expected: ClaimRef) -> Claim:
    """The `Claim` of `driver` in the ResourceClaim JSON `data`, which the kubelet named
    `expected`. ClaimError if it was replaced (another UID) or is not allocated."""
    where = f"claim {expected.namespace}/{expected.name}"
    try:
        obj = msgspec.json.decode(data, type=_ResourceClaim)
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ClaimError(f"{where}: undecodable: {exc}") from None
    if obj.metadata.uid != expected.uid:
        raise ClaimError(
            f"{where} got replaced: UID {obj.metadata.uid}, the kubelet asked for {expected.uid}"
        )
    allocation = obj.status.allocation
    if allocation is None or allocation.devices is None:
        raise ClaimError(f"{where} is not allocated")
    config = tuple(
        OpaqueConfig(
            source="FromClass" if entry.source == "FromClass" else "FromClaim",
            requests=tuple(entry.requests),
            parameters=entry.opaque.parameters,
        )
        for entry in _class_first(allocation.devices.config)
        if entry.opaque is not None and entry.opaque.driver == driver
    )
    devices = tuple(
        AllocatedDevice(
            request=result.request,
            pool=result.pool,
            device=result.device,
            config=tuple(c for c in config if c.applies_to(result.request)),
            share_id=result.shareID,
            consumed_capacity=dict(result.consumedCapacity),
            admin_access=bool(result.adminAccess),
        )
        for result in allocation.devices.results
        if result.driver == driver
    )
    return Claim(expected.namespace, expected.name, expected.uid, devices, config, raw)


def _class_first(entries: Sequence[_Config]) -> list[_Config]:
    # The scheduler records class entries before claim entries; sorted (stably) all the same,
    # so that a claim's own setting always wins over its class's.
    return sorted(entries, key=lambda e: e.source != "FromClass")
