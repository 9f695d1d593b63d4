"""Issue 20 item 1: a slice nodeagent does not manage, created in a pool it publishes around the
pool's first write. Reproduced on the real apiserver: created 0.5 s before a plugin registered,
the foreign slice reached the publisher's snapshot while its create was in flight or together
with the create's echo, was taken for the sync's own write, and the pool ended up with two slices
each claiming `resourceSliceCount: 1`, the component ready.

The snapshot here is the accumulator's: own writes shown at once (read-your-writes), another
writer's objects only once the watch delivers them (`deliver`), which the real notifier may
coalesce with later changes (up to `max_interval`). The create is held at explicit points so
the foreign slice lands exactly before, during or after it. Whatever the timing, within one
sync after the foreign slice is seen, the pool is refused (reported as the existing refusal is),
nodeagent's own slices in it are deleted, and publishing resumes once the foreign slice goes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.kube import CORE_EVENTS
from nodeagent.kube.errors import Conflict
from nodeagent.resources import metrics
from tests.support.fake_resourceslices import FakeCluster, FakeSource
from tests.unit.resources.test_publisher import Plugins, inventory, running, settle
from tests.unit.resources.test_publisher_write_safety import POOL, foreign_slice, value

FOREIGN = "someone-elses-slice"
Hook = Callable[[], Awaitable[None]]


class WatchedCluster(FakeCluster):
    """`FakeCluster` whose snapshots show another writer's objects only once delivered (the
    watch event), and whose slice creates can be held before they reach the server (`sent`)
    and after it stored them, before the answer is back (`stored`)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[str] = set()
        self.sent: Hook | None = None
        self.stored: Hook | None = None
        self.offer = True  # False: changes reach the view without waking its reader

    def put_external(self, obj: dict[str, Any], *, delivered: bool = True) -> dict[str, Any]:
        if not delivered:
            self.hidden.add(obj["metadata"]["name"])
        return super().put_external(obj)

    def _bump(self) -> None:
        if self.offer:
            super()._bump()
        else:
            self._version += 1

    def deliver(self) -> None:
        self.hidden.clear()
        self._bump()

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        if resource is CORE_EVENTS:
            return await super().create(resource, obj, namespace)
        sent, stored, self.sent, self.stored = self.sent, self.stored, None, None
        if sent is not None:
            await sent()
        answer = await super().create(resource, obj, namespace)
        if stored is not None:
            await stored()
        return answer

    @property
    def source(self) -> FakeSource:
        return _WatchedSource(self)


class _WatchedSource(FakeSource):
    c: WatchedCluster

    def update(self, target: object, deltas: Any = None) -> bool:
        if not super().update(target, deltas):
            return False
        shown = target.resourceslices  # type: ignore[attr-defined]
        target.resourceslices = {  # type: ignore[attr-defined]
            n: raw for n, raw in shown.items() if n not in self.c.hidden
        }
        return True


def managed(cluster: FakeCluster) -> list[str]:
    return sorted(
        n
        for n, o in cluster.objects.items()
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "nodeagent"
    )


def conflict_events(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [e for e in cluster.events if e["reason"] == "ResourceSlicePoolConflict"]


async def quiet(pub: Any) -> None:
    """Until no pool is queued or syncing (a hook holding a create also waits for the other
    tasks to block, so `settle` alone could return while the create is held)."""
    await settle()
    await pub.wait_idle()
    await settle()


async def assert_refused_then_resumed(cluster: WatchedCluster, pub: Any, refused: float) -> None:
    """The pool refused with nodeagent's slices gone, then published again once the foreign
    slice goes."""
    await quiet(pub)
    assert POOL in pub.refused(), "the foreign slice was taken for the sync's own write"
    assert list(cluster.objects) == [FOREIGN], "nodeagent's slice beside a foreign one"
    assert f"not managed by nodeagent ({FOREIGN})" in pub.failing()[POOL]
    assert value(metrics.SYNCS.labels("refused")) > refused
    assert value(metrics.REFUSED_POOLS) == 1
    (event,) = conflict_events(cluster)
    assert event["type"] == "Warning" and FOREIGN in event["message"]
    # Refused stays refused, with no writes: nothing loops.
    writes = len(cluster.writes())
    await trio.sleep(60)
    assert len(cluster.writes()) == writes and list(cluster.objects) == [FOREIGN]
    cluster.remove_external(FOREIGN)
    await quiet(pub)
    (ours,) = managed(cluster)
    assert list(cluster.objects) == [ours]
    assert cluster.objects[ours]["spec"]["pool"]["resourceSliceCount"] == 1
    assert pub.failing() == {} and pub.refused() == set()
    assert value(metrics.REFUSED_POOLS) == 0
    assert len(conflict_events(cluster)) == 1  # reported once


async def test_created_before_the_first_write_and_seen_during_it(autojump_clock: Any) -> None:
    """Created before the sync started, delivered while the create is in flight: the snapshot
    change during the sync was taken for the sync's own."""
    cluster, plugins = WatchedCluster(), Plugins()
    refused = value(metrics.SYNCS.labels("refused"))
    cluster.put_external(foreign_slice(), delivered=False)

    async def sent() -> None:
        cluster.deliver()
        await trio.testing.wait_all_tasks_blocked()  # the publisher's watch takes it in

    cluster.sent = sent
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await assert_refused_then_resumed(cluster, pub, refused)


async def test_created_during_the_first_write_and_seen_with_its_echo(
    autojump_clock: Any,
) -> None:
    """Created while the create is in flight (before the server stores it), delivered in the
    same snapshot as the create's own echo."""
    cluster, plugins = WatchedCluster(), Plugins()
    refused = value(metrics.SYNCS.labels("refused"))

    async def sent() -> None:
        cluster.put_external(foreign_slice(), delivered=False)

    async def stored() -> None:
        cluster.deliver()  # shown with the answer: no watch wake-up before the sync ends

    cluster.sent, cluster.stored = sent, stored
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await assert_refused_then_resumed(cluster, pub, refused)


async def test_created_after_the_server_stored_the_first_write(autojump_clock: Any) -> None:
    """Created once the create is stored, its answer not yet back, delivered at once."""
    cluster, plugins = WatchedCluster(), Plugins()
    refused = value(metrics.SYNCS.labels("refused"))

    async def stored() -> None:
        cluster.put_external(foreign_slice())
        await trio.testing.wait_all_tasks_blocked()

    cluster.stored = stored
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await assert_refused_then_resumed(cluster, pub, refused)


async def test_created_just_after_the_first_write(autojump_clock: Any) -> None:
    cluster, plugins = WatchedCluster(), Plugins()
    refused = value(metrics.SYNCS.labels("refused"))
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await settle()
        assert len(managed(cluster)) == 1
        cluster.put_external(foreign_slice())
        await assert_refused_then_resumed(cluster, pub, refused)


async def test_appearing_in_a_pool_published_for_long(autojump_clock: Any) -> None:
    """A pool published for a while (two slices), then another writer's slice appears in it:
    nodeagent's slices go, also while the plugin's inventory keeps changing."""
    cluster, plugins = WatchedCluster(), Plugins()
    refused = value(metrics.SYNCS.labels("refused"))
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(200))
        await trio.sleep(300)
        assert len(managed(cluster)) == 2
        cluster.put_external(foreign_slice())
        await settle()
        assert list(cluster.objects) == [FOREIGN]
        plugins.send(inventory(3, memory="1Gi"))
        await trio.sleep(1)
        assert list(cluster.objects) == [FOREIGN]
        assert POOL in pub.refused()
        cluster.remove_external(FOREIGN)
        await settle()
        (ours,) = managed(cluster)
        assert cluster.objects[ours]["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"
        assert pub.failing() == {} and value(metrics.REFUSED_POOLS) == 0
        assert value(metrics.SYNCS.labels("refused")) > refused


async def test_seen_by_the_watch_but_not_yet_offered(autojump_clock: Any) -> None:
    """The watch has the foreign slice, the accumulator has not offered the change yet (it
    offers at most once per second): the sync takes the newest view first, so the pool is
    refused with no write at all."""
    cluster, plugins = WatchedCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        cluster.offer = False  # in the accumulator's view, no offer (no wake-up) yet
        cluster.put_external(foreign_slice())
        plugins.send(inventory(3))
        await quiet(pub)
        assert cluster.writes() == []
        assert POOL in pub.refused()


@pytest.mark.parametrize("where", ["sent", "stored"])
async def test_a_foreign_slice_of_another_pool_changes_nothing(
    autojump_clock: Any, where: str
) -> None:
    """Another pool's (or driver's) foreign slice arriving mid-write is none of this pool's
    business: one create, no refusal."""
    cluster, plugins = WatchedCluster(), Plugins()

    async def hook() -> None:
        cluster.put_external(foreign_slice("elsewhere"))
        other = foreign_slice()
        other["metadata"]["name"] = "another-drivers-slice"
        other["spec"]["driver"] = "other.example.com"
        cluster.put_external(other)
        await trio.testing.wait_all_tasks_blocked()

    setattr(cluster, where, hook)
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await trio.sleep(10)
        assert [c[0] for c in cluster.writes()] == ["create"]
        assert pub.failing() == {}
        assert len(managed(cluster)) == 1


async def test_a_refusal_deletes_nodeagents_slices_with_preconditions(
    autojump_clock: Any,
) -> None:
    """The deletes of a refused pool carry the observed UID and resourceVersion: a slice
    changed meanwhile is not deleted blind (a Conflict retries with the newer state)."""
    cluster, plugins = WatchedCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await settle()
        (ours,) = managed(cluster)
        cluster.faults = [Conflict(409, "Conflict", "the object has been modified")]
        cluster.put_external(foreign_slice())
        await trio.sleep(5)
        assert list(cluster.objects) == [FOREIGN]
        assert [c for c in cluster.writes() if c[0] == "delete"] == [("delete", ours)] * 2
        assert POOL in pub.refused()


def test_the_fake_hides_undelivered_objects() -> None:
    cluster = WatchedCluster()
    cluster.put_external(foreign_slice(), delivered=False)

    class Snap:
        resourceslices: Any = {}
        node: Any = {}

    snap = Snap()
    assert cluster.source.update(snap)
    assert snap.resourceslices == {}
    cluster.deliver()
    src = cluster.source
    assert src.update(snap)
    assert [msgspec.json.decode(v)["metadata"]["name"] for v in snap.resourceslices.values()] == [
        FOREIGN
    ]
