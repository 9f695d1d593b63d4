"""The client's dry run against the real kube-apiserver: every verb goes with dryRun=All and
stores nothing, validation and admission still answer, the record's diffs hold only what the
write changes, and a write to an object only the dry run created is worked out."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from nodeagent.kube import CONFIGMAPS, NAMESPACES, RESOURCESLICES, KubeClient, errors
from nodeagent.kube.dryrun import DryRun
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer

pytestmark = pytest.mark.integration


def _cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.fixture
async def ns(admin_client: KubeClient) -> AsyncIterator[str]:
    name = f"dry-{uuid.uuid4().hex[:8]}"
    await admin_client.create(NAMESPACES, {"metadata": {"name": name}})
    yield name
    await admin_client.delete(NAMESPACES, name)


@pytest.fixture
async def dry(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, DryRun]]:
    recorder = DryRun()
    async with client_for(apiserver, "admin", dry_run=recorder) as client:
        yield client, recorder


async def test_every_verb_is_answered_and_nothing_is_stored(
    admin_client: KubeClient, dry: tuple[KubeClient, DryRun], ns: str
) -> None:
    client, recorder = dry
    held = msgspec.json.decode(
        await admin_client.create(
            CONFIGMAPS,
            {**_cm("held", a="1"), "metadata": {"name": "held", "labels": {"x": "y"}}},
            ns,
        )
    )
    created = msgspec.json.decode(await client.create(CONFIGMAPS, _cm("new", k="v"), ns))
    assert created["metadata"]["name"] == "new" and created["data"] == {"k": "v"}
    update = {**held, "data": {"a": "2"}}
    assert msgspec.json.decode(await client.update(CONFIGMAPS, update, ns))["data"] == {"a": "2"}
    patched = await client.patch(CONFIGMAPS, "held", {"data": {"b": "3"}}, ns)
    assert msgspec.json.decode(patched)["data"] == {"a": "1", "b": "3"}
    await client.apply(
        CONFIGMAPS, _cm("held", c="4"), ns, field_manager="nodeagent-dry-run-test", force=True
    )
    await client.delete(CONFIGMAPS, "held", ns)
    await client.delete_collection(CONFIGMAPS, ns, label_selector="x=y")

    # Nothing stored: the new one does not exist, the held one is as it was.
    with pytest.raises(errors.NotFound):
        await admin_client.get(CONFIGMAPS, "new", ns)
    after = msgspec.json.decode(await admin_client.get(CONFIGMAPS, "held", ns))
    assert after["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert after["data"] == {"a": "1"}

    views = [w.view() for w in recorder.writes]
    assert [(v["verb"], v["object"]["name"]) for v in views] == [
        ("create", "new"),
        ("update", "held"),
        ("patch", "held"),
        ("patch", "held"),
        ("delete", "held"),
        ("delete", "held"),
    ]
    # Only what the write changes: no resourceVersion, uid, managedFields or timestamps.
    assert views[1]["diff"] == [{"op": "replace", "path": "/data/a", "value": "2"}]
    assert views[2]["diff"] == [{"op": "add", "path": "/data/b", "value": "3"}]
    assert {"op": "add", "path": "/data/c", "value": "4"} in views[3]["diff"]
    assert all(
        not op["path"].startswith("/metadata/managedFields") for v in views for op in v["diff"]
    )
    assert {"op": "remove", "path": "/data"} in views[4]["diff"]


async def test_validation_and_admission_still_answer(
    apiserver: ApiServer, dry: tuple[KubeClient, DryRun], ns: str
) -> None:
    client, recorder = dry
    with pytest.raises(errors.Invalid):
        await client.create(CONFIGMAPS, _cm("Not_A_Name"), ns)
    # node-a may not publish node-b's slices (NodeRestriction): refused in a dry run too.
    node_recorder = DryRun()
    async with client_for(apiserver, "node-a", dry_run=node_recorder) as node_a:
        with pytest.raises(errors.Forbidden):
            await node_a.create(
                RESOURCESLICES,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"generateName": "node-b-dry-"},
                    "spec": {
                        "driver": "gpu.example.com",
                        "nodeName": "node-b",
                        "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
                        "devices": [],
                    },
                },
            )
    assert recorder.total == 0 and node_recorder.total == 0


async def test_a_write_to_a_would_be_object_is_worked_out(
    admin_client: KubeClient, dry: tuple[KubeClient, DryRun], ns: str
) -> None:
    client, recorder = dry
    await client.create(CONFIGMAPS, _cm("fresh", k="v"), ns)
    # The server answers NotFound (the create stored nothing); a real create would have made it.
    answer = msgspec.json.decode(await client.patch(CONFIGMAPS, "fresh", {"data": {"j": "w"}}, ns))
    assert answer["data"] == {"k": "v", "j": "w"}
    with pytest.raises(errors.NotFound):
        await admin_client.get(CONFIGMAPS, "fresh", ns)
    create, patch = (w.view() for w in recorder.writes)
    assert "unchecked" not in create and patch["unchecked"] is True
    assert patch["diff"] == [{"op": "add", "path": "/data/j", "value": "w"}]
