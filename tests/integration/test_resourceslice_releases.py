"""What each supported release keeps of a pool using every field the agent writes, with its
default feature gates (and the newest with every DRA gate on): the pool is published, makes no
write while unchanged, and the fields the server dropped are exactly those whose gate the
running server has off, each reported with that gate (`Publisher.dropped()`, the metric).

The dropped-field list per release is printed (`-s`) and asserted against the server's own
gates (`ApiServer.feature_enabled`), so a release that turns a gate on changes the list, not
the test."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import suppress

import msgspec
import pytest

from nodeagent.kube import NODES, RESOURCESLICES, errors
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import metrics
from nodeagent.resources.convert import from_native
from nodeagent.resources.dropped import FIELD_GATES, present_fields
from nodeagent.resources.model import desired_slices
from nodeagent.sdk import Device, Taint, build_inventory
from tests.integration.conftest import client_for
from tests.integration.test_resourceslice_gates import _settled
from tests.integration.test_resourceslices import (
    DRIVER,
    NODE,
    Plugins,
    node_slices,
    publisher,
    settle,
    versions,
)
from tests.support.apiserver import (
    RELEASE_ENV,
    ApiServer,
    releases,
    selected_gates,
    selected_release,
    start_apiserver,
)
from tests.unit.sdk.test_devices_v137 import partitioned_pool

pytestmark = [pytest.mark.integration, pytest.mark.releases]

NODE_ALLOCATABLE = "DRANodeAllocatableResources"
# Every release by default; a CI lane that picks one ($NODEAGENT_KUBE_RELEASE) runs that one.
LANES = (
    [(selected_release(), selected_gates())]
    if os.environ.get(RELEASE_ENV, "").strip()
    else [(r, "default") for r in releases()] + [(releases()[0], "all-dra")]
)


@pytest.fixture(scope="module", params=LANES, ids=[f"{r}-{g}" for r, g in LANES])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    release, gates = request.param
    srv = start_apiserver(
        tmp_path_factory.mktemp(f"r{release}-{gates}"), release=release, gates=gates
    )
    try:
        yield srv
    finally:
        srv.close()


def every_field() -> device_pb2.Inventory:
    """The SDK's pool with every 1.37 field, plus a tainted partition."""
    pool = partitioned_pool()
    tainted = Device(
        "gpu-0-9",
        attributes={"gpu.example.com/profile": "1g.10gb"},
        taints=[Taint("example.com/unhealthy")],
    )
    return build_inventory([dataclasses.replace(pool, devices=[*pool.devices, tainted])])


def gate_on(srv: ApiServer, gate: str) -> bool:
    return all(srv.feature_enabled(g) for g in gate.split("+"))


def expected(srv: ApiServer, sent_fields: set[str]) -> dict[str, str]:
    """The fields a write of `sent_fields` loses on `srv`: a field whose gate is off, unless a
    field it is part of is lost already (only the outermost is reported)."""
    lost = {f for f in sent_fields if f in FIELD_GATES and not gate_on(srv, FIELD_GATES[f])}
    outer = {f for f in lost if not any(f.startswith(o + ".") for o in lost if o != f)}
    return {f: FIELD_GATES[f] for f in outer}


async def test_each_release_keeps_or_reports_every_field(server: ApiServer) -> None:
    inv = every_field()
    model_inv = from_native(DRIVER, inv)
    sent: set[str] = set()
    for spec in desired_slices(DRIVER, model_inv.pools[0], NODE):
        sent |= set(present_fields(msgspec.to_builtins(spec)))
    want = expected(server, sent)
    async with client_for(server, "admin") as admin:
        with suppress(errors.AlreadyExists):
            await admin.create(
                NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            )
        # A device with nodeAllocatableResources is admitted only onto a Node that declares
        # the feature (the kubelet's status.declaredFeatures; admission nodedeclaredfeatures).
        await admin.request(
            "PATCH",
            NODES.path(None, NODE, "status"),
            body=msgspec.json.encode({"status": {"declaredFeatures": [NODE_ALLOCATABLE]}}),
            content_type="application/merge-patch+json",
            verb="patch",
            resource="nodes",
        )
        plugins = Plugins()
        plugins.send(inv)
        async with publisher(server, plugins) as pub:
            items = await _settled(pub, admin, 2)
            got = pub.dropped().get((DRIVER, NODE), {})
            print(f"\n{server.version}: dropped {sorted(got.items())}")
            assert pub.failing() == {}
            assert pub.dropped().get((DRIVER, NODE), {}) == want
            for field in want:
                assert metrics.FIELDS_DROPPED.labels(DRIVER, field)._value.get() >= 1
            writes = pub.writes
            plugins.send(every_field())
            await settle(pub)
            assert pub.writes == writes
            assert versions(await node_slices(admin)) == versions(items)
        await admin.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")
