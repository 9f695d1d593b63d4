"""KubeClient CRUD, patch flavours, subresources and typed errors against a real apiserver."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import msgspec
import pytest
import trio
from prometheus_client import REGISTRY

from nodeagent.kube import (
    CONFIGMAPS,
    CUSTOMRESOURCEDEFINITIONS,
    NAMESPACES,
    NODES,
    RESOURCESLICES,
    KubeClient,
    Resource,
    WriteEvent,
    errors,
)
from nodeagent.kube.models import ConfigMap, Node, ObjectMeta
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def ns(admin_client: KubeClient) -> AsyncIterator[str]:
    name = _name("crud")
    await admin_client.create(NAMESPACES, {"metadata": {"name": name}})
    yield name


def _cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def test_configmap_round_trip(admin_client: KubeClient, ns: str) -> None:
    created = await admin_client.create(CONFIGMAPS, _cm("one", a="1"), ns, into=ConfigMap)
    assert created.metadata.uid and created.metadata.resource_version
    raw = await admin_client.get(CONFIGMAPS, "one", ns)
    assert json.loads(raw)["data"] == {"a": "1"}
    # A full object the test owns, sent back with its resourceVersion precondition.
    owned = ConfigMap(
        metadata=ObjectMeta(name="one", resource_version=created.metadata.resource_version),
        data={"a": "2"},
    )
    updated = await admin_client.update(CONFIGMAPS, owned, ns, into=ConfigMap)
    assert updated.data == {"a": "2"}
    assert updated.metadata.resource_version != created.metadata.resource_version
    assert await admin_client.delete(CONFIGMAPS, "one", ns) is None
    with pytest.raises(errors.NotFound) as exc:
        await admin_client.get(CONFIGMAPS, "one", ns)
    assert exc.value.code == 404 and '"one" not found' in exc.value.message


async def test_generate_name_and_paged_list(admin_client: KubeClient, ns: str) -> None:
    names = set()
    for _ in range(7):
        body = {"metadata": {"generateName": "gen-", "labels": {"set": "g"}}, "data": {}}
        names.add((await admin_client.create(CONFIGMAPS, body, ns, into=ConfigMap)).metadata.name)
    assert len(names) == 7 and all(n.startswith("gen-") and len(n) > 4 for n in names)
    result = await admin_client.list(
        CONFIGMAPS, ns, into=ConfigMap, label_selector="set=g", page_size=2
    )
    assert {c.metadata.name for c in result.items} == names
    assert result.resource_version
    pages = [
        p
        async for p in admin_client.list_pages(CONFIGMAPS, ns, label_selector="set=g", page_size=3)
    ]
    assert len(pages) == 3 and pages[-1].continue_token == ""
    raw = await admin_client.list(CONFIGMAPS, ns, label_selector="set=g")
    assert {json.loads(b)["metadata"]["name"] for b in raw.items} == names


def _api_requests(verb: str, code: str) -> float:
    labels = {"verb": verb, "resource": "configmaps", "code": code}
    return REGISTRY.get_sample_value("nodeagent_api_requests_total", labels) or 0.0


async def test_typed_errors(admin_client: KubeClient, ns: str) -> None:
    # Every failed write is also counted by verb and status code (the metric half of "a failed
    # API write is reported"; the typed error carries the server's message to the caller).
    failures = [("create", "409"), ("update", "409"), ("create", "422"), ("patch", "404")]
    before = {key: _api_requests(*key) for key in failures}
    first = await admin_client.create(CONFIGMAPS, _cm("dup"), ns, into=ConfigMap)
    with pytest.raises(errors.AlreadyExists) as exists:
        await admin_client.create(CONFIGMAPS, _cm("dup"), ns)
    assert exists.value.code == 409 and "already exists" in exists.value.message

    await admin_client.patch(CONFIGMAPS, "dup", {"data": {"x": "1"}}, ns)
    stale = _cm("dup", x="2")
    stale["metadata"]["resourceVersion"] = first.metadata.resource_version
    with pytest.raises(errors.Conflict) as conflict:
        await admin_client.update(CONFIGMAPS, stale, ns)
    assert conflict.value.code == 409 and "modified" in conflict.value.message

    with pytest.raises(errors.Invalid) as invalid:
        await admin_client.create(CONFIGMAPS, _cm("Not_A_Valid_Name"), ns)
    assert invalid.value.code == 422
    assert any(c.field == "metadata.name" for c in invalid.value.causes), invalid.value.causes

    with pytest.raises(errors.NotFound):
        await admin_client.patch(CONFIGMAPS, "missing", {"data": {}}, ns)
    # Not retried (none of these is retryable): exactly one request each.
    assert {key: _api_requests(*key) - n for key, n in before.items()} == dict.fromkeys(
        failures, 1.0
    )


async def _ensure_node(admin: KubeClient, name: str) -> None:
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(NODES, {"metadata": {"name": name, "labels": {"test": "yes"}}})


async def test_node_identity_forbidden_on_other_node(
    admin_client: KubeClient, node_client: KubeClient
) -> None:
    for node in ("node-a", "node-b"):
        await _ensure_node(admin_client, node)
    own = await node_client.patch(
        NODES, "node-a", {"metadata": {"annotations": {"nodeagent/test": "1"}}}, into=Node
    )
    assert own.metadata.annotations["nodeagent/test"] == "1"
    with pytest.raises(errors.Forbidden) as forbidden:
        await node_client.patch(NODES, "node-b", {"metadata": {"annotations": {"x": "1"}}})
    assert forbidden.value.code == 403 and "node-a" in forbidden.value.message

    def slice_for(node: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": _name(node)},
            "spec": {
                "driver": "test.nodeagent.io",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev0"}],
            },
        }

    mine = await node_client.create(RESOURCESLICES, slice_for("node-a"))
    assert json.loads(mine)["spec"]["nodeName"] == "node-a"
    with pytest.raises(errors.Forbidden):
        await node_client.create(RESOURCESLICES, slice_for("node-b"))


async def test_unauthorized(apiserver: ApiServer) -> None:
    cfg = client_for(apiserver, "token").config
    async with KubeClient(replace(cfg, token="not-a-token", token_file=None)) as client:
        with pytest.raises(errors.Unauthorized) as exc:
            await client.get(NAMESPACES, "default")
    assert exc.value.code == 401


async def test_patch_flavours(admin_client: KubeClient, ns: str) -> None:
    await admin_client.create(CONFIGMAPS, _cm("p", a="1"), ns)
    merged = await admin_client.patch(CONFIGMAPS, "p", {"data": {"b": "2"}}, ns, into=ConfigMap)
    assert merged.data == {"a": "1", "b": "2"}
    # "$patch: replace" is a strategic-merge directive; as a merge patch it would be a key.
    strategic = await admin_client.patch(
        CONFIGMAPS,
        "p",
        {"data": {"$patch": "replace", "only": "x"}},
        ns,
        type="strategic",
        into=ConfigMap,
    )
    assert strategic.data == {"only": "x"}
    ops = [
        {"op": "test", "path": "/data/only", "value": "x"},
        {"op": "add", "path": "/data/c", "value": "3"},
    ]
    jsonp = await admin_client.patch(CONFIGMAPS, "p", ops, ns, type="json", into=ConfigMap)
    assert jsonp.data == {"only": "x", "c": "3"}
    with pytest.raises(errors.Invalid):
        await admin_client.patch(
            CONFIGMAPS, "p", [{"op": "test", "path": "/data/c", "value": "nope"}], ns, type="json"
        )


async def test_server_side_apply(admin_client: KubeClient, ns: str) -> None:
    applied = await admin_client.apply(
        CONFIGMAPS, _cm("ssa", owned="1"), ns, field_manager="nodeagent-a", into=ConfigMap
    )
    assert applied.data == {"owned": "1"}
    with pytest.raises(errors.Conflict) as conflict:
        await admin_client.apply(CONFIGMAPS, _cm("ssa", owned="2"), ns, field_manager="other")
    assert "conflict" in conflict.value.message.lower()
    forced = await admin_client.apply(
        CONFIGMAPS, _cm("ssa", owned="2"), ns, field_manager="other", force=True, into=ConfigMap
    )
    assert forced.data == {"owned": "2"}
    # Applying without a field previously applied by this manager removes it.
    await admin_client.apply(CONFIGMAPS, _cm("ssa", extra="e"), ns, field_manager="nodeagent-a")
    after = await admin_client.get(CONFIGMAPS, "ssa", ns, into=ConfigMap)
    assert after.data == {"owned": "2", "extra": "e"}


async def test_delete_preconditions_and_collection(admin_client: KubeClient, ns: str) -> None:
    events: list[WriteEvent] = []
    with admin_client.observe_writes(events.append):
        cm = await admin_client.create(CONFIGMAPS, _cm("pre"), ns, into=ConfigMap)
        with pytest.raises(errors.Conflict) as wrong_uid:
            await admin_client.delete(
                CONFIGMAPS, "pre", ns, uid="00000000-0000-0000-0000-000000000000"
            )
        assert "UID" in wrong_uid.value.message
        with pytest.raises(errors.Conflict):
            await admin_client.delete(CONFIGMAPS, "pre", ns, resource_version="1")
        assert (
            await admin_client.delete(
                CONFIGMAPS,
                "pre",
                ns,
                uid=cm.metadata.uid,
                resource_version=cm.metadata.resource_version,
            )
            is None
        )

        for i in range(3):
            body = _cm(f"col-{i}")
            body["metadata"]["labels"] = {"batch": "1"}
            await admin_client.create(CONFIGMAPS, body, ns)
        await admin_client.create(CONFIGMAPS, _cm("keep"), ns)
        await admin_client.delete_collection(CONFIGMAPS, ns, label_selector="batch=1")
        left = await admin_client.list(CONFIGMAPS, ns, into=ConfigMap)
        assert {c.metadata.name for c in left.items} >= {"keep"}
        assert not any(c.metadata.name.startswith("col-") for c in left.items)
    deletes = sorted(e.name for e in events if e.verb == "delete")
    assert deletes == ["col-0", "col-1", "col-2", "pre"]
    assert all(e.obj is None and e.namespace == ns for e in events if e.verb == "delete")


async def test_write_observers_see_every_write(admin_client: KubeClient, ns: str) -> None:
    seen: list[WriteEvent] = []

    def broken(_: WriteEvent) -> None:
        raise RuntimeError("observer bug")

    # A failing observer must not break the client or later observers.
    with admin_client.observe_writes(broken), admin_client.observe_writes(seen.append):
        created = await admin_client.create(
            CONFIGMAPS, {"metadata": {"generateName": "obs-", "finalizers": ["test/hold"]}}, ns
        )
        name = json.loads(created)["metadata"]["name"]
        await admin_client.patch(CONFIGMAPS, name, {"data": {"a": "1"}}, ns)
        # A finalizer keeps the object: the delete is reported as an update with that object.
        remaining = await admin_client.delete(CONFIGMAPS, name, ns)
        assert remaining is not None and json.loads(remaining)["metadata"]["deletionTimestamp"]
        await admin_client.patch(CONFIGMAPS, name, {"metadata": {"finalizers": None}}, ns)
    assert [e.verb for e in seen] == ["create", "patch", "update", "patch"]
    assert all(e.name == name and e.namespace == ns and e.resource == CONFIGMAPS for e in seen)
    assert seen[0].obj == created
    assert json.loads(seen[2].obj or b"{}")["metadata"]["deletionTimestamp"]
    with pytest.raises(errors.NotFound):
        await admin_client.get(CONFIGMAPS, name, ns)


CRD_GROUP = "test.nodeagent.io"


def _crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"size": {"type": "integer", "minimum": 0}},
            },
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{CRD_GROUP}"},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


class _Cond(msgspec.Struct):
    type: str
    status: str


class _CrdStatus(msgspec.Struct):
    conditions: list[_Cond] | None = None  # null until the apiserver sets the first one


class _Crd(msgspec.Struct):
    status: _CrdStatus = msgspec.field(default_factory=_CrdStatus)


async def _widgets(admin: KubeClient) -> Resource:
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(CUSTOMRESOURCEDEFINITIONS, _crd())
    with trio.fail_after(30):  # the apiserver establishes the CRD asynchronously
        while True:
            crd = await admin.get(CUSTOMRESOURCEDEFINITIONS, f"widgets.{CRD_GROUP}", into=_Crd)
            if any(
                c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
            ):
                break
            await trio.sleep(0.1)
    with trio.fail_after(30):
        while True:
            try:
                return await admin.discover(f"{CRD_GROUP}/v1", "Widget")
            except errors.NotFound:
                await trio.sleep(0.1)


class Widget(msgspec.Struct, kw_only=True):
    metadata: ObjectMeta
    spec: dict[str, int] = {}
    status: dict[str, str] = {}


async def test_crd_crud_and_status_subresource(admin_client: KubeClient, ns: str) -> None:
    widgets = await _widgets(admin_client)
    assert widgets == Resource(
        group=CRD_GROUP, version="v1", plural="widgets", kind="Widget", namespaced=True
    )
    body = {
        "apiVersion": f"{CRD_GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 1},
    }
    created = await admin_client.create(widgets, body, ns, into=Widget)
    assert created.spec == {"size": 1}
    with pytest.raises(errors.Invalid) as invalid:
        bad = {**body, "metadata": {"name": "bad"}, "spec": {"size": -1}}
        await admin_client.create(widgets, bad, ns)
    assert any(c.field == "spec.size" for c in invalid.value.causes), invalid.value.causes

    # The main resource ignores status; the status subresource ignores spec.
    await admin_client.patch(widgets, "w", {"status": {"phase": "ignored"}}, ns)
    status = await admin_client.patch(
        widgets,
        "w",
        {"status": {"phase": "Ready"}, "spec": {"size": 9}},
        ns,
        subresource="status",
        into=Widget,
    )
    assert status.status == {"phase": "Ready"} and status.spec == {"size": 1}
    via_sub = await admin_client.get(widgets, "w", ns, subresource="status", into=Widget)
    assert via_sub.status == {"phase": "Ready"}
    put = {**body, "metadata": {"name": "w", "resourceVersion": status.metadata.resource_version}}
    put["status"] = {"phase": "Done"}
    updated = await admin_client.update(widgets, put, ns, subresource="status", into=Widget)
    assert updated.status == {"phase": "Done"}
    applied = await admin_client.apply(
        widgets,
        {
            "apiVersion": f"{CRD_GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "status": {"phase": "Applied"},
        },
        ns,
        field_manager="nodeagent-status",
        subresource="status",
        force=True,
        into=Widget,
    )
    assert applied.status == {"phase": "Applied"}
    listed = await admin_client.list(widgets, ns, into=Widget)
    assert [w.metadata.name for w in listed.items] == ["w"]
    assert await admin_client.delete(widgets, "w", ns) is None
    with pytest.raises(errors.NotFound):
        await admin_client.get(widgets, "w", ns)


async def test_discover_core_and_unknown(admin_client: KubeClient) -> None:
    assert await admin_client.discover("v1", "ConfigMap") == CONFIGMAPS
    assert await admin_client.discover("v1", "Node") == NODES
    with pytest.raises(errors.NotFound):
        await admin_client.discover("v1", "NoSuchKind")
    with pytest.raises(errors.NotFound):
        await admin_client.discover("nope.example.com/v1", "Thing")
