"""Reading a driver's part of a ResourceClaim (`nodeagent.sdk.claims.parse_claim`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.sdk.claims import ClaimError, ClaimRef, OpaqueConfig, parse_claim

REF = ClaimRef("ns", "c", "uid-1")


def claim(results: list[dict[str, Any]], config: list[dict[str, Any]], uid: str = "uid-1") -> bytes:
    return json.dumps(
        {
            "metadata": {"name": "c", "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        }
    ).encode()


def result(device: str, request: str = "gpu", driver: str = "gpu.example.com") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": "node-a", "device": device}


def opaque(
    source: str, params: Any, requests: list[str] | None = None, driver: str = "gpu.example.com"
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def test_only_this_drivers_devices_and_configs_class_first() -> None:
    data = claim(
        [
            result("gpu-0"),
            result("nic-0", "net", driver="nic.example.com"),
            result("gpu-1", "big/sub"),
        ],
        [
            opaque("FromClaim", {"mode": "claim"}, ["gpu"]),
            opaque("FromClass", {"mode": "class"}),
            opaque("FromClaim", {"mtu": 9000}, driver="nic.example.com"),
            opaque("FromClaim", {"mode": "big"}, ["big"]),
        ],
    )
    parsed = parse_claim(data, "gpu.example.com", REF)
    assert [(d.request, d.device) for d in parsed.devices] == [
        ("gpu", "gpu-0"),
        ("big/sub", "gpu-1"),
    ]
    assert [c.parameters for c in parsed.config] == [
        {"mode": "class"},
        {"mode": "claim"},
        {"mode": "big"},
    ]
    # Per device: the class entry (all requests), then the claim's for its request; a
    # subrequest gets its parent request's entries.
    assert [c.parameters for c in parsed.devices[0].config] == [
        {"mode": "class"},
        {"mode": "claim"},
    ]
    assert [c.parameters for c in parsed.devices[1].config] == [{"mode": "class"}, {"mode": "big"}]
    assert parsed.raw["metadata"]["uid"] == "uid-1"


def test_a_replaced_or_unallocated_or_broken_claim_is_refused() -> None:
    with pytest.raises(ClaimError, match="got replaced: UID other"):
        parse_claim(claim([], [], uid="other"), "gpu.example.com", REF)
    unallocated = json.dumps({"metadata": {"uid": "uid-1"}, "status": {}}).encode()
    with pytest.raises(ClaimError, match="claim ns/c is not allocated"):
        parse_claim(unallocated, "gpu.example.com", REF)
    with pytest.raises(ClaimError, match="undecodable"):
        parse_claim(b'{"metadata": 5}', "gpu.example.com", REF)


def test_opaque_config_scope() -> None:
    everyone = OpaqueConfig("FromClass", (), None)
    assert everyone.applies_to("gpu") and everyone.applies_to("x/y")
    some = OpaqueConfig("FromClaim", ("gpu",), None)
    assert some.applies_to("gpu") and some.applies_to("gpu/small") and not some.applies_to("net")
