"""The Kubernetes 1.37 device model against the real kube-apiserver with every DRA gate on
(the ``all-dra`` lane of the newest release; on an older release the fields it does not know are
expected dropped):

- a plugin on the SDK (native API, real unix socket) -> the plugin manager -> the publisher, with
  node credentials: every new device and slice field is in the stored slice, an unchanged
  re-publish writes nothing, a changed request policy is one update;
- the counter-set fields (compatibility groups, the partition type attribute), from the same
  SDK -> wire -> model -> desired-spec path, written as the server wants them laid out;
- the agent's verdict on every case of `device_field_cases` is the server's (dry-run creates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.accumulator import Accumulator
from nodeagent.kube import RESOURCESLICES, KubeClient, errors
from nodeagent.kube.metrics import WATCH_EVENTS
from nodeagent.plugins import PluginManager
from nodeagent.resources.convert import from_native
from nodeagent.resources.model import (
    InvalidInventory,
    Inventory,
    ResourceSliceSpec,
    desired_slices,
    validate_inventory,
)
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.rpc import GrpcBridge, open_grpc_bridge
from nodeagent.sdk import (
    Capacity,
    Device,
    DevicePlugin,
    NodeAllocatable,
    Pool,
    RequestPolicy,
    ValidRange,
    build_inventory,
)
from tests.integration.conftest import client_for
from tests.integration.test_resourceslices import NODE, TIMEOUT, admin, node_slices
from tests.plugins.conftest import fast_settings
from tests.support.api_requests import api_writes
from tests.support.apiserver import ApiServer, apiserver_fixture, newest_release
from tests.support.wait import wait_until
from tests.unit.resources.device_field_cases import CASES, Case
from tests.unit.sdk.test_devices_v137 import partitioned_pool

pytestmark = [pytest.mark.integration, pytest.mark.releases]
__all__ = ["admin"]  # the fixture, re-used

# This module's own server: every DRA gate of the release on.
apiserver = apiserver_fixture(scope="module", name="apiserver", gates="all-dra")

DRIVER = "gpu.example.com"

# Which gate keeps which field (beyond DynamicResourceAllocation).
GATES = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "bindsToNode": "DRADeviceBindingConditions",
    "nodeAllocatableResources": "DRANodeAllocatableResources",
    "compatibilityGroups": "DRADeviceCompatibilityGroups",
    "partitionTypeAttribute": "DRAPartitionableDevicesType",
    "skipNodeOperations": "DRAOptionalNodeOperations",
    "consumesCounters": "DRAPartitionableDevices",
    "sharedCounters": "DRAPartitionableDevices",
}


GPU_POOL = "node-a-gpus"


def _without_pool(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "pool"}


def watch_events() -> float:
    value: float = WATCH_EVENTS.labels("resourceslices")._value.get()
    return value


# 1.36 has the DRANodeAllocatableResources gate but an earlier form of the field
# (nodeAllocatableResourceMappings, retired in 1.37): it drops 1.37's nodeAllocatableResources
# and validates nothing of it, gate on or off.
FIELD_SINCE = {"DRANodeAllocatableResources": (1, 37)}


def gate_keeps(srv: ApiServer, gate: str) -> bool:
    """Whether `srv` stores (and validates) the 1.37 field behind `gate`."""
    since = FIELD_SINCE.get(gate, (0,))
    return srv.feature_enabled(gate) and _release_key(srv.release) >= since


def kept(srv: ApiServer, obj: Any) -> Any:
    """`obj` without the fields whose gate is off on `srv` (what a write of it stores)."""
    if isinstance(obj, dict):
        return {
            k: kept(srv, v) for k, v in obj.items() if k not in GATES or gate_keeps(srv, GATES[k])
        }
    if isinstance(obj, list):
        return [kept(srv, v) for v in obj]
    return obj


# kube-apiserver 1.37's NodeDeclaredFeatures admission forbids (403) a slice with
# nodeAllocatableResources on a node whose kubelet does not declare this feature in
# status.declaredFeatures; a kubelet with DRANodeAllocatableResources on declares it.
NODE_FEATURE = "DRANodeAllocatableResources"


async def declare_node_feature(srv: ApiServer, admin: KubeClient) -> None:
    """What the node's kubelet would do, then until the admission plugin's cache has it."""
    if not srv.feature_enabled(NODE_FEATURE):
        return
    await admin.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        body=msgspec.json.encode({"status": {"declaredFeatures": [NODE_FEATURE]}}),
        content_type="application/merge-patch+json",
        verb="patch",
        resource="nodes",
    )
    inv = from_native(DRIVER, build_inventory([Pool(NODE, devices())]))
    (probe,) = _slices(desired_slices(DRIVER, inv.pools[0], NODE))

    async def admitted() -> bool:
        try:
            await _dry_run(admin, probe)
        except errors.Forbidden:
            return False
        return True

    await wait_until(admitted, "the node's declared feature, seen by admission")


@pytest.fixture
async def declared(apiserver: ApiServer, admin: KubeClient) -> KubeClient:
    await declare_node_feature(apiserver, admin)
    return admin


@pytest.fixture
async def bridge() -> AsyncIterator[GrpcBridge]:
    async with open_grpc_bridge() as opened:
        yield opened


def devices(default: str = "1G") -> list[Device]:
    """A consumable-capacity NIC with binding conditions, and a CPU device mapping node CPUs."""
    return [
        Device(
            "nic-0",
            attributes={"model": "cx7"},
            capacity={
                "bandwidth": Capacity(
                    "100G",
                    RequestPolicy(
                        default=default, valid_range=ValidRange(min="1G", max="10G", step="1G")
                    ),
                ),
                "queues": Capacity(
                    "16", RequestPolicy(default="2", valid_values=["1", "2000m", "4", "8"])
                ),
            },
            allow_multiple_allocations=True,
            binding_conditions=["example.com/attached"],
            binding_failure_conditions=["example.com/attach-failed"],
            binds_to_node=True,
        ),
        Device(
            "cpu-0",
            capacity={"cores": "8"},
            node_allocatable={
                "cpu": NodeAllocatable(capacity_key="cores", capacity_multiplier="2"),
                "memory": NodeAllocatable(per_pod="64Mi", per_container="1024Ki"),
            },
        ),
    ]


EXPECTED_DEVICES: list[dict[str, Any]] = [
    {
        "name": "nic-0",
        "attributes": {"model": {"string": "cx7"}},
        "capacity": {
            "bandwidth": {
                "value": "100G",
                "requestPolicy": {
                    "default": "1G",
                    "validRange": {"min": "1G", "max": "10G", "step": "1G"},
                },
            },
            "queues": {
                "value": "16",
                "requestPolicy": {"default": "2", "validValues": ["1", "2", "4", "8"]},
            },
        },
        "allowMultipleAllocations": True,
        "bindingConditions": ["example.com/attached"],
        "bindingFailureConditions": ["example.com/attach-failed"],
        "bindsToNode": True,
    },
    {
        "name": "cpu-0",
        "capacity": {"cores": {"value": "8"}},
        "nodeAllocatableResources": {
            "cpu": {"mapping": {"capacityKey": "cores", "capacityMultiplier": "2"}},
            "memory": {"overhead": {"perPod": "64Mi", "perContainer": "1Mi"}},
        },
    },
]


def test_the_newest_release_keeps_every_field(apiserver: ApiServer) -> None:
    # An older release may lack the newer gates (their fields are then expected dropped, see
    # `kept`); on the newest, nothing of this module may be dropped.
    if apiserver.release == newest_release():
        assert [g for g in GATES.values() if not apiserver.feature_enabled(g)] == []


@asynccontextmanager
async def publishing(client: KubeClient, manager: PluginManager) -> AsyncIterator[Publisher]:
    async with trio.open_nursery() as nursery:
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=manager.channel("DRAPlugin"),
            settings=ResourcesSettings(startup_grace=0.5, disconnect_grace=5.0),
            client=client,
            slices=acc,
        )
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        yield pub
        nursery.cancel_scope.cancel()


async def idle(pub: Publisher) -> None:
    with trio.fail_after(TIMEOUT):
        await pub.wait_inventories()
        await pub.wait_idle()


async def test_every_new_field_survives_the_agents_publish(
    apiserver: ApiServer, declared: KubeClient, bridge: GrpcBridge, registry: str
) -> None:
    admin = declared
    manager = PluginManager(fast_settings(registry), bridge)
    channel = manager.channel("DRAPlugin")
    async with client_for(apiserver, NODE) as client, trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        async with DevicePlugin.serve(
            name=DRIVER, registry_dir=registry, bridge=bridge, pool=NODE
        ) as plugin:
            pool = Pool(NODE, devices(), skip_node_operations=["NodeUnprepareResources"])
            # MIG-style partitions: a counter set, two partitions with a compatibility group
            # and a partition type.
            gpus = dataclasses.replace(partitioned_pool(), name=GPU_POOL)
            await plugin.publish_pools([pool, gpus])

            async def received() -> bool:
                return DRIVER in channel.value

            await wait_until(received, "the plugin's inventory")

            async def published(name: str = NODE) -> list[dict[str, Any]] | None:
                items = [
                    o
                    for o in await node_slices(admin)
                    if o["spec"]["driver"] == DRIVER and o["spec"]["pool"]["name"] == name
                ]
                return items or None

            async def both() -> bool:
                return bool(await published() and await published(GPU_POOL))

            async with publishing(client, manager) as pub:
                await wait_until(both, "both pools")
                await idle(pub)
            (obj,) = await published() or []
            spec = obj["spec"]
            assert spec["devices"] == kept(apiserver, EXPECTED_DEVICES)
            expected_skip = kept(apiserver, {"skipNodeOperations": ["NodeUnprepareResources"]})
            assert spec.get("skipNodeOperations") == expected_skip.get("skipNodeOperations")
            # The partitioned pool: what the agent would publish is what is stored (a slice of
            # counter sets, then the partitions' slice with the partition type).
            inv = from_native(DRIVER, build_inventory([gpus]))
            want = [msgspec.to_builtins(s) for s in desired_slices(DRIVER, inv.pools[0], NODE)]
            got = [o["spec"] for o in await published(GPU_POOL) or []]
            assert sorted(map(_without_pool, got), key=repr) == sorted(
                (_without_pool(kept(apiserver, w)) for w in want), key=repr
            )
            assert len(got) == 2

            # A restarted agent compares what it would publish with what is stored: equal (or,
            # where the release dropped a field, equal to what it keeps), so nothing is written.
            written = api_writes()
            async with publishing(client, manager) as pub:
                await idle(pub)
                assert pub.writes == 0
                assert api_writes() == written
                (again,) = await published() or []
                assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]

                # A changed request policy is one in-place update.
                changed = Pool(NODE, devices("2G"), skip_node_operations=pool.skip_node_operations)
                await plugin.publish_pools([changed, gpus])

                async def updated() -> dict[str, Any] | None:
                    items = await published() or []
                    if len(items) != 1:
                        return None
                    cap = items[0]["spec"]["devices"][0]["capacity"]["bandwidth"]
                    return items[0] if cap.get("requestPolicy", {}).get("default") == "2G" else None

                if apiserver.feature_enabled("DRAConsumableCapacity"):
                    after = await wait_until(updated, "the new default")
                    assert after["metadata"]["name"] == obj["metadata"]["name"]
                    await idle(pub)
                    assert api_writes() == written + 1
        nursery.cancel_scope.cancel()


def _slices(pool_specs: list[ResourceSliceSpec]) -> list[dict[str, Any]]:
    specs = [msgspec.to_builtins(spec) for spec in pool_specs]
    for s in specs:
        s["pool"] = {"name": s["pool"]["name"], "generation": 1, "resourceSliceCount": len(specs)}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": "dm-"},
            "spec": s,
        }
        for s in specs
    ]


async def _dry_run(admin: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    body = await admin.request(
        "POST",
        RESOURCESLICES.path(None),
        params={"dryRun": "All"},
        body=msgspec.json.encode(obj),
        content_type="application/json",
        verb="create",
        resource="resourceslices",
        idempotent=False,
    )
    stored: dict[str, Any] = msgspec.json.decode(body)
    return stored


async def test_counter_set_fields_survive_a_write(
    apiserver: ApiServer, declared: KubeClient
) -> None:
    admin = declared
    inv = from_native(DRIVER, build_inventory([partitioned_pool()]))
    validate_inventory(inv)
    sent = _slices(desired_slices(DRIVER, inv.pools[0], NODE))
    stored = [await _dry_run(admin, s) for s in sent]
    for s, got in zip(sent, stored, strict=True):
        assert got["spec"] == kept(apiserver, s["spec"])
    partitions = [d for got in stored for d in got["spec"].get("devices", []) if "gpu" in d["name"]]
    assert len(partitions) == 2
    if apiserver.feature_enabled("DRADeviceCompatibilityGroups"):
        assert all(d["consumesCounters"][0]["compatibilityGroups"] == ["mig"] for d in partitions)
    if apiserver.feature_enabled("DRAPartitionableDevicesType"):
        (with_parts,) = [g for g in stored if g["spec"].get("partitionTypeAttribute")]
        assert with_parts["spec"]["partitionTypeAttribute"] == "gpu.example.com/profile"


def _needs(srv: ApiServer, case: Case) -> bool:
    return all(gate_keeps(srv, g) for g in case.alpha)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_the_agents_verdict_is_the_servers(
    apiserver: ApiServer, declared: KubeClient, case: Case
) -> None:
    admin = declared
    if not _needs(apiserver, case):
        # The server drops the field and accepts; that the agent tells the operator is the
        # dropped-fields report's test. Checked here: the server really drops it.
        (obj,) = _slices(desired_slices(DRIVER, case.pool, NODE))[-1:]
        got = await _dry_run(admin, obj)
        assert got["spec"] == kept(apiserver, obj["spec"])
        return
    try:
        validate_inventory(Inventory(driver=DRIVER, pools=[case.pool]))
        ours = None
    except InvalidInventory as exc:
        ours = str(exc)
    older = _release_key(apiserver.release) < (1, 37) and case.before_137 is not None
    if older and case.before_137 == "panic":
        # kube-apiserver before 1.37 panics on this input (fixed in 1.37): the handler is
        # aborted and the connection closed without a response, a transport error to the agent
        # (a failed write, retried with backoff).
        with pytest.raises(errors.TransportError, match="without sending a response"):
            for obj in _slices(desired_slices(DRIVER, case.pool, NODE)):
                await _dry_run(admin, obj)
        return
    theirs = None
    for obj in _slices(desired_slices(DRIVER, case.pool, NODE)):
        try:
            await _dry_run(admin, obj)
        except errors.Invalid as exc:
            theirs = exc.message
            break
    if older:
        # The agent keeps 1.37's rules (stricter or looser here); the older server's own
        # verdict is pinned so that a change in it shows.
        assert (theirs is None) == case.before_137, theirs
        return
    assert (ours is None) == (theirs is None), f"agent: {ours}\nserver: {theirs}"
    assert (theirs is None) == case.valid, theirs


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))
