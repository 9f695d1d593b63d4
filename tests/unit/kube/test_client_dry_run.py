"""The client's dry run: every write carries dryRun=All, is recorded with its diff, and a
repeated write is answered from memory; the recorder's bounds. The real apiserver's side is
tests/process/test_dry_run.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from nodeagent.core.errors import ConfigError
from nodeagent.kube import CONFIGMAPS, CORE_EVENTS, ClusterConfig, KubeClient, WriteEvent
from nodeagent.kube.dryrun import DRY_RUN_WRITES, DryRun, diff
from nodeagent.kube.errors import Invalid, NotFound
from tests.support.fake_http_apiserver import mock_client, status


class DryServer:
    """A ConfigMap endpoint that answers writes as a dry-run apiserver does: the would-be
    object, nothing stored."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {
            "held": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "held",
                    "namespace": "ns",
                    "uid": "u-1",
                    "resourceVersion": "7",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "managedFields": [{"manager": "x"}],
                },
                "data": {"a": "1", "gone": "x"},
            }
        }
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.refuse = False
        self.dry = True

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        self.requests.append((request.method, request.url.path, params))
        name = request.url.path.rsplit("/", 1)[-1]
        if request.method == "GET":
            if name in self.stored:
                return httpx.Response(200, json=self.stored[name])
            return status(404, "NotFound")
        if self.refuse:
            return status(422, "Invalid", "data.a: Invalid value")
        if request.method == "DELETE":
            # With a body the apiserver reads DeleteOptions from it alone (the query's dryRun
            # is ignored): the body must say it too.
            if request.content and self.dry:
                assert json.loads(request.content)["dryRun"] == ["All"]
            if request.url.path.endswith("/configmaps"):
                return httpx.Response(
                    200, json={"kind": "ConfigMapList", "items": [self.stored["held"]]}
                )
            return httpx.Response(200, json={"kind": "Status", "status": "Success"})
        body = json.loads(request.content)
        if request.method == "POST":
            meta = body.setdefault("metadata", {})
            if "generateName" in meta:
                meta["name"] = meta["generateName"] + "abcde"
            meta["uid"] = "dry-uid"
            return httpx.Response(201, json=body)
        if request.method == "PATCH":
            merged = json.loads(json.dumps(self.stored[name]))
            merged["data"].update(body.get("data", {}))
            return httpx.Response(200, json=merged)
        return httpx.Response(200, json=body)  # PUT

    def writes(self) -> list[tuple[str, str, dict[str, str]]]:
        return [r for r in self.requests if r[0] != "GET"]


def _held_update() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": "ns", "resourceVersion": "7"},
        "data": {"a": "2"},
    }


async def test_every_write_carries_dry_run_all_and_reads_do_not() -> None:
    server = DryServer()
    recorder = DryRun()
    async with mock_client(server, dry_run=recorder) as client:
        await client.get(CONFIGMAPS, "held", "ns")
        await client.create(CONFIGMAPS, {"metadata": {"generateName": "cm-"}}, "ns")
        await client.update(CONFIGMAPS, _held_update(), "ns")
        await client.patch(CONFIGMAPS, "held", {"data": {"b": "3"}}, "ns")
        await client.apply(
            CONFIGMAPS,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held"}},
            "ns",
            field_manager="nodeagent",
        )
        await client.delete(CONFIGMAPS, "held", "ns")
        await client.delete_collection(CONFIGMAPS, "ns", label_selector="x=y")
        # A raw call (the publisher's own dry runs use this path) cannot persist either.
        await client.request("POST", CONFIGMAPS.path("ns"), body=b'{"metadata":{"name":"r"}}')
    writes = server.writes()
    assert [m for m, _, _ in writes] == [
        "POST",
        "PUT",
        "PATCH",
        "PATCH",
        "DELETE",
        "DELETE",
        "POST",
    ]
    assert all(p.get("dryRun") == "All" for _, _, p in writes)
    assert all("dryRun" not in p for m, _, p in server.requests if m == "GET")
    assert [w.verb for w in recorder.writes] == [
        "create",
        "update",
        "patch",
        "patch",
        "delete",
        "delete",
    ]
    assert recorder.total == 6


async def test_a_real_client_sends_no_dry_run() -> None:
    server = DryServer()
    server.dry = False
    async with mock_client(server) as client:
        assert client.dry_run is None
        await client.update(CONFIGMAPS, _held_update(), "ns")
        await client.delete(CONFIGMAPS, "held", "ns")
    assert all("dryRun" not in p for _, _, p in server.requests)


async def test_a_raw_delete_in_a_dry_run_needs_delete_options() -> None:
    server = DryServer()
    async with mock_client(server, dry_run=DryRun()) as client:
        await client.request("DELETE", CONFIGMAPS.path("ns", "held"), body=b'{"kind":"x"}')
        with pytest.raises(ValueError, match="DeleteOptions"):
            await client.request("DELETE", CONFIGMAPS.path("ns", "held"), body=b"[1]")
    assert len(server.writes()) == 1


async def test_the_record_names_the_object_and_diffs_it_against_the_cluster() -> None:
    server = DryServer()
    recorder = DryRun()
    async with mock_client(server, dry_run=recorder) as client:
        await client.update(CONFIGMAPS, _held_update(), "ns")
        await client.create(
            CONFIGMAPS,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"generateName": "cm-"},
                "data": {"k": "v"},
            },
            "ns",
        )
        await client.delete(CONFIGMAPS, "held", "ns")
    update, create, delete = (w.view() for w in recorder.writes)
    assert update["object"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": "ns",
        "name": "held",
    }
    # Server-managed metadata (uid, resourceVersion, creationTimestamp, managedFields) is no
    # part of the diff: only what the write changes is.
    assert update["diff"] == [
        {"op": "replace", "path": "/data/a", "value": "2"},
        {"op": "remove", "path": "/data/gone"},
    ]
    assert create["object"]["name"] == "cm-abcde"
    assert create["object"]["generateName"] == "cm-"
    assert {"op": "add", "path": "/data", "value": {"k": "v"}} in create["diff"]
    assert not any(op["path"].startswith("/metadata/uid") for op in create["diff"])
    assert delete["verb"] == "delete" and delete["object"]["name"] == "held"
    assert {"op": "remove", "path": "/data"} in delete["diff"]


async def test_the_same_write_again_is_answered_from_memory_and_not_observed() -> None:
    server = DryServer()
    recorder = DryRun()
    seen: list[WriteEvent] = []
    before = DRY_RUN_WRITES.labels("update", "configmaps")._value.get()
    async with mock_client(server, dry_run=recorder) as client:
        with client.observe_writes(seen.append):
            first = await client.update(CONFIGMAPS, _held_update(), "ns")
            again = await client.update(CONFIGMAPS, _held_update(), "ns")
            changed = _held_update()
            changed["data"]["a"] = "3"
            await client.update(CONFIGMAPS, changed, "ns")
    assert first == again
    assert [m for m, _, _ in server.writes()] == ["PUT", "PUT"]  # the repeat was not sent
    assert recorder.total == 2 and recorder.repeated == 1
    # Nothing will reach the watch: the readers' view (the write observers) stays the
    # cluster's.
    assert seen == []
    assert DRY_RUN_WRITES.labels("update", "configmaps")._value.get() == before + 2


async def test_a_refused_write_raises_and_is_neither_recorded_nor_remembered() -> None:
    server = DryServer()
    server.refuse = True
    recorder = DryRun()
    async with mock_client(server, dry_run=recorder) as client:
        for _ in range(2):
            with pytest.raises(Invalid):
                await client.update(CONFIGMAPS, _held_update(), "ns")
    assert len(server.writes()) == 2  # validation answered both times
    assert recorder.total == 0 and recorder.repeated == 0


async def test_a_component_rewriting_its_desired_state_does_not_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What a publisher does when its would-be object expires from its view (nothing in the
    watch confirms it): it writes the same desired state again at every sync. Over ten virtual
    minutes of syncs every second, the server sees one write and one read per desired change,
    and the recorder one write per desired change."""
    server = DryServer()
    recorder = DryRun()
    desired = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "node-a.1", "namespace": "default"},
        "reason": "Ready",
    }
    async with mock_client(server, dry_run=recorder) as client:
        for second in range(600):
            if second == 300:
                desired = {**desired, "reason": "NotReady"}  # one desired change
            await client.create(CORE_EVENTS, desired, "default")
            await trio.sleep(1)
    assert len(server.writes()) == 2
    assert recorder.total == 2 and recorder.repeated == 598
    assert [w.diff for w in recorder.writes][1] == (
        {"op": "add", "path": "/apiVersion", "value": "v1"},
        {"op": "add", "path": "/kind", "value": "Event"},
        {"op": "add", "path": "/metadata", "value": {"name": "node-a.1", "namespace": "default"}},
        {"op": "add", "path": "/reason", "value": "NotReady"},
    )


class UnstoredServer(DryServer):
    """As a dry-run apiserver: a write to an object that does not exist is NotFound (the dry
    run's own create stored nothing)."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        if request.method in ("PUT", "PATCH", "DELETE") and name not in ("held", "configmaps"):
            self.requests.append((request.method, request.url.path, dict(request.url.params)))
            return status(404, "NotFound", f'configmaps "{name}" not found')
        if request.url.path.endswith("/status"):
            self.requests.append((request.method, request.url.path, dict(request.url.params)))
            return status(404, "NotFound", "not found")
        return await super().__call__(request)


async def test_a_write_to_an_object_only_the_dry_run_created_is_worked_out_and_unchecked() -> None:
    """The CNR writer's create, then its status apply: the server answers the second NotFound
    (the create stored nothing); the dry run works it out on the would-be object instead of
    failing (a real agent's would succeed) and says the server could not check it."""
    server = UnstoredServer()
    recorder = DryRun()
    new = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fresh"}}
    async with mock_client(server, dry_run=recorder) as client:
        await client.create(CONFIGMAPS, new, "ns")
        answer = await client.apply(
            CONFIGMAPS,
            {**new, "data": {"k": "v"}},
            "ns",
            field_manager="nodeagent",
            subresource="status",
        )
        assert json.loads(answer)["data"] == {"k": "v"}
        merged = await client.patch(CONFIGMAPS, "fresh", {"data": {"k": None, "j": "w"}}, "ns")
        assert json.loads(merged)["data"] == {"j": "w"}
        with pytest.raises(NotFound):  # a JSON patch cannot be worked out here
            await client.patch(CONFIGMAPS, "fresh", [{"op": "add"}], "ns", type="json")
        with pytest.raises(NotFound):  # not an object this dry run created
            await client.patch(CONFIGMAPS, "other", {"data": {}}, "ns")
        assert await client.delete(CONFIGMAPS, "fresh", "ns") is None
        with pytest.raises(NotFound):  # gone from the dry run too
            await client.patch(CONFIGMAPS, "fresh", {"data": {"x": "y"}}, "ns")
    views = [w.view() for w in recorder.writes]
    assert [(v["verb"], v.get("unchecked", False)) for v in views] == [
        ("create", False),
        ("patch", True),
        ("patch", True),
        ("delete", True),
    ]
    assert views[1]["diff"] == [{"op": "add", "path": "/data", "value": {"k": "v"}}]
    assert views[2]["diff"] == [
        {"op": "add", "path": "/data/j", "value": "w"},
        {"op": "remove", "path": "/data/k"},
    ]


def test_the_recorder_keeps_the_newest_writes_and_counts_the_older() -> None:
    recorder = DryRun(keep=3)
    for i in range(10):
        body = json.dumps({"kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}}).encode()
        recorder.record("create", CONFIGMAPS, "ns", "", body, None)
    view = recorder.view()
    assert (view["total"], view["older"]) == (10, 7)
    assert [w["object"]["name"] for w in view["writes"]] == ["cm-7", "cm-8", "cm-9"]
    assert [w["seq"] for w in view["writes"]] == [8, 9, 10]


def test_a_large_diff_is_cut_and_says_how_much_is_left_out() -> None:
    recorder = DryRun(max_diff_bytes=1024)
    data = {f"key-{i:03d}": "x" * 40 for i in range(100)}
    body = json.dumps({"kind": "ConfigMap", "metadata": {"name": "big"}, "data": data})
    entry = recorder.record("update", CONFIGMAPS, "ns", "big", body.encode(), b'{"data":{}}')
    encoded = len(json.dumps(list(entry.diff)))
    assert encoded <= 1024
    assert entry.omitted > 0
    assert len(entry.diff) + entry.omitted == 102  # the data keys, kind and metadata
    assert entry.view()["diff_omitted"] == entry.omitted


def test_the_memo_is_bounded_least_recently_used_first() -> None:
    recorder = DryRun(memo=2)
    keys = [recorder.key("PUT", f"/p/{i}", None, b"{}") for i in range(3)]
    recorder.remember(keys[0], b"0")
    recorder.remember(keys[1], b"1")
    assert recorder.answered(keys[0]) == b"0"  # now the most recently used
    recorder.remember(keys[2], b"2")
    assert recorder.answered(keys[1]) is None
    assert recorder.answered(keys[0]) == b"0" and recorder.answered(keys[2]) == b"2"


def test_the_memo_is_bounded_in_bytes_too() -> None:
    recorder = DryRun(memo_bytes=10)
    keys = [recorder.key("PUT", "/p", None, bytes([i])) for i in range(3)]
    recorder.remember(keys[0], b"x" * 6)
    recorder.remember(keys[1], b"y" * 4)
    assert recorder.answered(keys[0]) is not None and recorder.answered(keys[1]) is not None
    recorder.remember(keys[2], b"z" * 3)  # 13 bytes: the least recently used answer goes
    assert recorder.answered(keys[0]) is None
    assert recorder.answered(keys[1]) == b"y" * 4 and recorder.answered(keys[2]) == b"z" * 3
    recorder.remember(keys[0], b"w" * 50)  # larger than the bound alone: kept, alone
    assert [recorder.answered(k) for k in keys] == [b"w" * 50, None, None]


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("keep", {"keep": 0}), ("max_diff_bytes", {"max_diff_bytes": 10}), ("memo", {"memo": 0})],
)
def test_bad_bounds_name_the_field(field: str, kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match=field):
        DryRun(**kwargs)


def test_diff_escapes_pointer_keys_and_compares_lists_of_one_length_by_item() -> None:
    old: dict[str, Any] = {"metadata": {"labels": {"a/b": "1", "t~x": "1"}}, "items": [1, 2]}
    new: dict[str, Any] = {"metadata": {"labels": {"a/b": "2", "t~x": "1"}}, "items": [1, 3]}
    old["more"], new["more"], new["n"] = [1], [1, 2], 1
    assert diff(old, new) == [
        {"op": "replace", "path": "/items/1", "value": 3},
        {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
        {"op": "replace", "path": "/more", "value": [1, 2]},
        {"op": "add", "path": "/n", "value": 1},
    ]
    assert diff({"x": 1}, {"x": 1.0}) == [{"op": "replace", "path": "/x", "value": 1.0}]


def test_the_client_composes_its_transport() -> None:
    client = KubeClient(ClusterConfig(server="http://kube.test"), qps=5, burst=7)
    other = KubeClient(client.config, transport=client.transport)
    assert other.transport is client.transport
    assert (other.limiter.qps, other.limiter.burst) == (5, 7)
    assert not client.transport.dry_run
