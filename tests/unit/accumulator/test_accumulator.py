"""The accumulator over in-memory sinks: gating, coalescing timing (autojump clock),
snapshots, deltas, predicates, read-your-writes and error paths."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.accumulator import (
    Accumulator,
    AccumulatorSettings,
    Delta,
    DeltaType,
    ObjectKey,
    ObjectMap,
    Query,
    QueryForbiddenError,
    QueryState,
    QueryStatus,
)
from nodeagent.accumulator.sink import StoreSink
from nodeagent.core.errors import ConfigError
from nodeagent.kube import errors
from nodeagent.kube.client import Verb, WriteEvent
from nodeagent.kube.models import ConfigMap
from nodeagent.kube.resource import CONFIGMAPS
from nodeagent.kube.watch import WatchSink
from tests.support.fake_http_apiserver import FakeCluster, line, mock_client, status
from tests.support.fake_http_apiserver import obj as kube_obj
from tests.support.fake_watch import SECRETS, WIDGETS, FakeClient
from tests.unit.accumulator.helpers import dump, event, obj, page


@dataclass
class Snap:
    cms: ObjectMap[Any] = field(default_factory=ObjectMap)
    widgets: ObjectMap[Any] = field(default_factory=ObjectMap)


CMS = Query("cms", "v1", "ConfigMap", namespace="default", into=ConfigMap)
WIDGETS_Q: Query[bytes] = Query("widgets", "example.com/v1", "Widget")  # raw: no `into`


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def running(
    queries: list[Query[Any]] | None = None, **settings: Any
) -> AsyncIterator[tuple[Accumulator, FakeClient]]:
    client = FakeClient()
    acc = Accumulator(
        client, queries or [CMS, WIDGETS_Q], AccumulatorSettings(**settings), watch=client.run_watch
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(acc.run)
        yield acc, client
        nursery.cancel_scope.cancel()


async def synced(sink: WatchSink, *items: dict[str, Any], rv: int = 1) -> None:
    await sink.begin_list()
    await sink.list_page(page(list(items), rv))
    await sink.end_list(str(rv))


async def bootstrap(client: FakeClient, *cms: dict[str, Any]) -> WatchSink:
    cm_sink = await client.sink("configmaps")
    await synced(cm_sink, *cms)
    await synced(await client.sink("widgets"))
    return cm_sink


async def notified_within(acc: Accumulator, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        await acc.changed()
        return True
    return False


def names(m: ObjectMap[Any]) -> list[tuple[str, str]]:
    return [(k.namespace, k.name) for k in m]


async def test_no_snapshot_until_every_query_synced(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        cm = await client.sink("configmaps")
        await synced(cm, obj("a", 1), obj("b", 2))
        assert not await notified_within(acc, 30)
        snap = Snap()
        assert not acc.update(snap)
        assert acc.not_ready_reason() == "widgets: not synced"
        await synced(await client.sink("widgets"))  # empty counts as synced
        assert await notified_within(acc, 0.001)
        assert acc.update(snap)
        assert names(snap.cms) == [("default", "a"), ("default", "b")]
        assert isinstance(snap.cms[ObjectKey("default", "a")], ConfigMap)
        assert len(snap.widgets) == 0
        assert acc.not_ready_reason() is None
        assert not acc.update(snap)


async def test_first_update_true_even_if_everything_empty(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        await bootstrap(client)
        await acc.changed()
        deltas: list[Delta[Any]] = []
        snap = Snap()
        assert acc.update(snap, deltas)
        assert deltas == [] and len(snap.cms) == 0 and len(snap.widgets) == 0
        assert not await notified_within(acc, 60)


async def test_isolated_change_offered_at_once_churn_once_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_interval=5.0) as (acc, client):
        cm = await bootstrap(client)
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        t0 = trio.current_time()
        # A change right after a notification waits for the interval, with later ones folded in.
        await trio.sleep(1)
        await cm.feed(event("ADDED", obj("a", 2)))
        await trio.sleep(1)
        await cm.feed(event("ADDED", obj("b", 3)))
        await acc.changed()
        assert trio.current_time() - t0 == pytest.approx(5.0)
        assert acc.update(snap)
        assert names(snap.cms) == [("default", "a"), ("default", "b")]
        # After a quiet period an isolated change is offered immediately.
        await trio.sleep(60)
        t1 = trio.current_time()
        await cm.feed(event("MODIFIED", obj("a", 4)))
        await acc.changed()
        assert trio.current_time() == t1
        acc.update(snap)


async def test_continuous_churn_is_not_starved(autojump_clock: trio.testing.MockClock) -> None:
    async with running(max_interval=5.0) as (acc, client):
        cm = await bootstrap(client)
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        times: list[float] = []

        async def churn() -> None:
            for i in range(30):
                await trio.sleep(1)
                await cm.feed(event("ADDED", obj(f"o{i}", 10 + i)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(churn)
            start = trio.current_time()
            while len(times) < 5:
                await acc.changed()
                times.append(trio.current_time() - start)
                assert acc.update(snap)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g == pytest.approx(5.0) for g in gaps), times
        assert times[-1] < 30


async def test_busy_consumer_gets_one_notification_for_everything(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_interval=1.0) as (acc, client):
        cm = await bootstrap(client)
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        # Nobody waits: intake goes on, every feed returns at once.
        for i in range(50):
            with trio.fail_after(0.001):
                await cm.feed(event("ADDED", obj(f"o{i}", 10 + i)))
            await trio.sleep(0.5)
        await acc.changed()
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert len(snap.cms) == 50 and len(deltas) == 50
        assert all(d.type is DeltaType.ADD for d in deltas)
        assert not await notified_within(acc, 30)


async def test_consumer_raising_loses_nothing(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1))
        snap = Snap()

        async def consumer() -> None:
            await acc.changed()
            raise RuntimeError("consumer bug")

        with pytest.raises(RuntimeError):
            await consumer()
        await cm.feed(event("MODIFIED", obj("a", 2)))
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert [(d.type, d.resource_version) for d in deltas] == [(DeltaType.ADD, "2")]


async def test_relist_in_progress_holds_notification(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1), obj("b", 2))
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        await cm.begin_list()
        await cm.list_page(page([obj("a", 1), obj("c", 5)], 6))
        assert not await notified_within(acc, 30)
        assert not acc.update(snap)  # the half-applied relist stays invisible
        assert names(snap.cms) == [("default", "a"), ("default", "b")]
        await cm.end_list("6")
        await acc.changed()
        deltas: list[Delta[Any]] = []
        acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [
            (DeltaType.DELETE, "b"),
            (DeltaType.ADD, "c"),
        ]


async def test_deltas_and_keys_are_namespaced_and_ordered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q: Query[bytes] = Query("cms", "v1", "ConfigMap")  # all namespaces, raw bytes
    async with running([q, WIDGETS_Q]) as (acc, client):
        await bootstrap(client, obj("x", 1, "zz"), obj("x", 2, "aa"), obj("b", 3, "aa"))
        snap = Snap()
        deltas: list[Delta[Any]] = []
        acc.update(snap, deltas)
        assert names(snap.cms) == [("aa", "b"), ("aa", "x"), ("zz", "x")]
        assert snap.cms[ObjectKey("zz", "x")] == dump(obj("x", 1, "zz"))
        assert [tuple(d.key) for d in deltas] == names(snap.cms)
        assert client.watch_args["configmaps"]["namespace"] is None


async def test_unchanged_objects_are_not_decoded_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1), obj("b", 2))
        first, second = Snap(), Snap()
        acc.update(first)
        await cm.feed(event("MODIFIED", obj("b", 3)))
        acc.update(second)
        key_a, key_b = ObjectKey("default", "a"), ObjectKey("default", "b")
        assert second.cms[key_a] is first.cms[key_a]
        assert second.cms[key_b] is not first.cms[key_b]
        assert first.cms[key_b].metadata.resource_version == "2"  # old snapshots are immutable


async def test_predicate_filters_and_transitions(autojump_clock: trio.testing.MockClock) -> None:
    q = Query[ConfigMap](
        "cms",
        "v1",
        "ConfigMap",
        into=ConfigMap,
        predicate=lambda cm: cm.metadata.labels.get("show") == "yes",
    )
    async with running([q, WIDGETS_Q]) as (acc, client):
        cm = await bootstrap(client, obj("a", 1, labels={"show": "yes"}), obj("b", 2))
        snap = Snap()
        deltas: list[Delta[Any]] = []
        acc.update(snap, deltas)
        assert names(snap.cms) == [("default", "a")]
        assert [d.key.name for d in deltas] == ["a"]
        # Excluded object changing: no delta, no change.
        await cm.feed(event("MODIFIED", obj("b", 3)))
        assert not acc.update(snap, deltas) and deltas == []
        await cm.feed(
            event("MODIFIED", obj("b", 4, labels={"show": "yes"})) + event("MODIFIED", obj("a", 5))
        )
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [
            (DeltaType.DELETE, "a"),
            (DeltaType.ADD, "b"),
        ]
        assert deltas[0].obj.metadata.resource_version == "1"  # the last one shown
        assert names(snap.cms) == [("default", "b")]


async def test_undecodable_object_keeps_last_good(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1, data={"k": "v"}))
        snap = Snap()
        acc.update(snap)
        before = metric("nodeagent_accumulator_malformed_total", query="cms", source="decode")
        bad = obj("a", 2)
        bad["data"] = {"k": 5}  # ConfigMap data values must be strings
        await cm.feed(event("MODIFIED", bad))
        assert not acc.update(snap)
        assert snap.cms[ObjectKey("default", "a")].data == {"k": "v"}
        after = metric("nodeagent_accumulator_malformed_total", query="cms", source="decode")
        assert after == before + 1
        await cm.feed(event("MODIFIED", obj("a", 3, data={"k": "w"})))
        assert acc.update(snap)
        assert snap.cms[ObjectKey("default", "a")].data == {"k": "w"}


async def test_predicate_raising_keeps_last_good(autojump_clock: trio.testing.MockClock) -> None:
    def pred(cm: ConfigMap) -> bool:
        if cm.data.get("boom"):
            raise KeyError("boom")
        return True

    q = Query[ConfigMap]("cms", "v1", "ConfigMap", into=ConfigMap, predicate=pred)
    async with running([q, WIDGETS_Q]) as (acc, client):
        cm = await bootstrap(client, obj("a", 1))
        snap = Snap()
        acc.update(snap)
        await cm.feed(event("MODIFIED", obj("a", 2, data={"boom": "1"})))
        assert not acc.update(snap)
        assert snap.cms[ObjectKey("default", "a")].metadata.resource_version == "1"


async def test_malformed_events_are_counted_and_skipped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client)
        before = metric("nodeagent_accumulator_malformed_total", query="cms", source="event")
        res = await cm.feed(b"{garbage\n" + event("ADDED", obj("a", 7)))
        assert res.events == 1 and res.resource_version == "7" and res.error is None
        after = metric("nodeagent_accumulator_malformed_total", query="cms", source="event")
        assert after == before + 1
        snap = Snap()
        acc.update(snap)
        assert names(snap.cms) == [("default", "a")]


async def test_error_event_reaches_the_client(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (_acc, client):
        cm = await bootstrap(client)
        res = await cm.feed(
            b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",'
            b'"message":"too old"}}\n'
        )
        assert res.error is not None
        assert (res.error.code, res.error.reason, res.error.message) == (410, "Expired", "too old")


async def test_malformed_list_page_is_reported(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1))
        snap = Snap()
        acc.update(snap)
        before = metric("nodeagent_accumulator_malformed_total", query="cms", source="list_page")
        await cm.begin_list()
        await cm.list_page(b'{"items": [{"metadata"')
        await cm.end_list("9")
        deltas: list[Delta[Any]] = []
        acc.update(snap, deltas)  # True: the query is known again; no object changed
        assert deltas == [] and names(snap.cms) == [("default", "a")]
        after = metric("nodeagent_accumulator_malformed_total", query="cms", source="list_page")
        assert after == before + 1


async def test_large_chunks_parse_in_a_worker_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(thread_threshold=0) as (acc, client):
        cm = await bootstrap(client)
        data = b"".join(event("ADDED", obj(f"o{i}", 10 + i)) for i in range(100))
        res = await cm.feed(data)
        assert res.events == 100
        snap = Snap()
        acc.update(snap)
        assert len(snap.cms) == 100


async def test_cancelled_consumer_loses_no_notification(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_interval=1.0) as (acc, client):
        cm = await bootstrap(client)
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        # Cancelled while nothing is offered: returns at the deadline, nothing is consumed.
        assert not await notified_within(acc, 5)
        await cm.feed(event("ADDED", obj("a", 10)))
        await trio.testing.wait_all_tasks_blocked()
        # Cancelled while an offer is pending: the offer stays for the next wait.
        with trio.CancelScope() as scope:
            scope.cancel()
            await acc.changed()
        assert scope.cancelled_caught
        assert await notified_within(acc, 0.001)
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.ADD, "a")]


async def test_feed_cancelled_in_a_worker_thread_keeps_the_store_consistent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(thread_threshold=0) as (acc, client):
        cm = await bootstrap(client)
        await acc.changed()
        snap = Snap()
        acc.update(snap)
        data = b"".join(event("ADDED", obj(f"o{i}", 10 + i)) for i in range(50))
        with trio.CancelScope() as scope:
            scope.cancel()
            await cm.feed(data)
        assert scope.cancelled_caught
        # All or nothing; if applied, it is offered like any other change.
        await trio.testing.wait_all_tasks_blocked()
        applied = await notified_within(acc, 2)
        assert acc.update(snap) is applied
        assert len(snap.cms) in (0, 50) and (len(snap.cms) == 50) is applied
        # The watch resumes and delivers the chunk again: the result is the same either way.
        await cm.feed(data)
        await acc.changed()
        acc.update(snap)
        assert len(snap.cms) == 50


async def test_cancellation_mid_list_and_mid_wait_ends_the_accumulator_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = FakeClient()
    acc = Accumulator(client, [CMS, WIDGETS_Q], AccumulatorSettings(), watch=client.run_watch)
    waiter_cancelled = trio.Event()

    async def consumer() -> None:
        try:
            await acc.changed()
        except trio.Cancelled:
            waiter_cancelled.set()
            raise

    with trio.fail_after(1):  # virtual time: anything that ignored the cancel would hang here
        async with trio.open_nursery() as nursery:
            await nursery.start(acc.run)
            cm = await client.sink("configmaps")
            await cm.begin_list()
            await cm.list_page(page([obj("a", 1)], 1))  # half a list
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert waiter_cancelled.is_set()
    assert not acc.bootstrapped
    assert not acc.update(Snap())


async def test_forbidden_counts_as_synced_empty(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient()
    client.forbidden.add("widgets")
    acc = Accumulator(
        client, [CMS, WIDGETS_Q], AccumulatorSettings(forbidden_retry=100), watch=client.run_watch
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(acc.run)
        await synced(await client.sink("configmaps"), obj("a", 1))
        await acc.changed()
        snap = Snap()
        assert acc.update(snap)
        assert len(snap.widgets) == 0 and len(snap.cms) == 1
        reason = acc.not_ready_reason()
        assert reason is not None and "widgets: list forbidden" in reason
        assert metric("nodeagent_accumulator_forbidden", query="widgets") == 1
        assert acc.status("widgets").state is QueryState.FORBIDDEN
        assert not acc.status("widgets").known and acc.status("cms").known
        # RBAC fixed: the next attempt lists for real; Forbidden until that list completes.
        client.forbidden.clear()
        w = await client.sink("widgets")
        await w.begin_list()
        assert acc.status("widgets").state is QueryState.FORBIDDEN
        await w.list_page(page([], 2))
        await w.end_list("2")
        assert acc.not_ready_reason() is None
        assert acc.status("widgets") == QueryStatus("widgets", QueryState.SYNCED)
        assert metric("nodeagent_accumulator_forbidden", query="widgets") == 0
        await w.feed(event("ADDED", obj("w", 3, kind="Widget")))
        acc.update(snap)
        assert names(snap.widgets) == [("default", "w")]
        nursery.cancel_scope.cancel()


async def test_forbidden_fatal(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient()
    client.forbidden.add("widgets")
    acc = Accumulator(
        client, [CMS, WIDGETS_Q], AccumulatorSettings(forbidden_fatal=True), watch=client.run_watch
    )
    with pytest.RaisesGroup(
        pytest.RaisesExc(QueryForbiddenError, match="widgets"), flatten_subgroups=True
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(acc.run)


async def test_unknown_kind_is_retried_and_reported(autojump_clock: trio.testing.MockClock) -> None:
    q: Query[bytes] = Query("widgets", "example.com/v1", "Gadget")
    async with running([CMS, q]) as (acc, client):
        await trio.sleep(5)
        reason = acc.not_ready_reason()
        assert reason is not None and "widgets: discovery failed" in reason
        client.resources["Gadget"] = WIDGETS
        await synced(await client.sink("widgets"))
        assert acc.not_ready_reason() == "cms: not synced"


def write(verb: Verb, o: dict[str, Any] | None, name: str = "a", ns: str = "default") -> WriteEvent:
    return WriteEvent(CONFIGMAPS, verb, ns, name, dump(o) if o is not None else None)


async def test_read_your_writes(autojump_clock: trio.testing.MockClock) -> None:
    async with running(max_interval=1.0) as (acc, client):
        cm = await bootstrap(client, obj("a", 1, data={"n": "0"}))
        snap = Snap()
        acc.update(snap)
        for i in range(1, 26):
            client.write(write("update", obj("a", 1 + i, data={"n": str(i)})))
            acc.update(snap)
            assert snap.cms[ObjectKey("default", "a")].data == {"n": str(i)}
        # The delayed watch now replays the history: nothing moves backwards, no deltas.
        deltas: list[Delta[Any]] = []
        for i in range(1, 26):
            await cm.feed(event("MODIFIED", obj("a", 1 + i, data={"n": str(i)})))
            acc.update(snap, deltas)
            assert snap.cms[ObjectKey("default", "a")].data == {"n": "25"}
            assert deltas == []
        # Own create and delete, then the watch confirms both.
        client.write(write("create", obj("b", 40), "b"))
        acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.ADD, "b")]
        client.write(write("delete", None, "b"))
        acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.DELETE, "b")]
        await cm.feed(event("ADDED", obj("b", 40)) + event("DELETED", obj("b", 41)))
        assert not acc.update(snap, deltas)


async def test_local_write_respects_query_scope(autojump_clock: trio.testing.MockClock) -> None:
    q: Query[bytes] = Query(
        "cms",
        "v1",
        "ConfigMap",
        namespace="default",
        label_selector="app=x",
        field_selector="metadata.name!=skip",
    )
    async with running([q, WIDGETS_Q]) as (acc, client):
        await bootstrap(client)
        snap = Snap()
        acc.update(snap)
        client.write(write("create", obj("a", 5, "other", labels={"app": "x"}), ns="other"))
        client.write(write("create", obj("b", 6, labels={"app": "y"}), "b"))
        client.write(write("create", obj("skip", 7, labels={"app": "x"}), "skip"))
        assert not acc.update(snap)
        client.write(write("create", obj("c", 8, labels={"app": "x"}), "c"))
        assert acc.update(snap)
        assert names(snap.cms) == [("default", "c")]
        # An update that takes it out of the selection removes it.
        client.write(write("update", obj("c", 9, labels={"app": "z"}), "c"))
        assert acc.update(snap)
        assert len(snap.cms) == 0


async def test_unconfirmed_local_write_expires(autojump_clock: trio.testing.MockClock) -> None:
    async with running(local_write_ttl=20.0) as (acc, client):
        await bootstrap(client)
        snap = Snap()
        acc.update(snap)
        client.write(write("create", obj("ghost", 5), "ghost"))
        await acc.changed()
        acc.update(snap)
        assert names(snap.cms) == [("default", "ghost")]
        await acc.changed()  # the expiry sweep offers the removal
        assert trio.current_time() >= 20.0
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.DELETE, "ghost")]


async def test_update_requires_fields(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        await bootstrap(client)

        class Partial:
            cms: ObjectMap[Any] = ObjectMap()

        with pytest.raises(AttributeError, match="widgets"):
            acc.update(Partial())


async def test_update_fills_fields_that_are_only_annotated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The docs' example view (docs/architecture/accumulator.md): one bare annotation per query.
    async with running() as (acc, client):
        await bootstrap(client, obj("a", 1))

        class View:
            cms: ObjectMap[ConfigMap]
            widgets: ObjectMap[bytes]

        class Slotted:
            __slots__ = ("cms", "widgets")

        view, slotted = View(), Slotted()
        assert acc.update(view)
        assert [k.name for k in view.cms] == ["a"] and len(view.widgets) == 0
        acc.update(slotted)
        assert [k.name for k in slotted.cms] == ["a"]  # type: ignore[attr-defined]


def test_invalid_settings_and_queries() -> None:
    with pytest.raises(ConfigError, match=r"accumulator\.max_interval"):
        AccumulatorSettings(max_interval=0).validate()
    with pytest.raises(ConfigError, match="local_write_ttl"):
        AccumulatorSettings(local_write_ttl=-1).validate()
    with pytest.raises(ValueError, match="identifier"):
        Query("not a name", "v1", "ConfigMap")
    with pytest.raises(ValueError, match="label selector"):
        Query("q", "v1", "ConfigMap", label_selector="a in b")
    with pytest.raises(ValueError, match="unique"):
        Accumulator(FakeClient(), [CMS, CMS])
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"max_interval": 1, "nope": 2}, AccumulatorSettings)
    with pytest.raises(TypeError, match="FakeClient is not a KubeClient: pass watch="):
        Accumulator(FakeClient(), [CMS])


async def test_own_writes_are_observed_only_while_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = FakeClient()
    acc = Accumulator(client, [CMS, WIDGETS_Q], watch=client.run_watch)
    assert client.observers == []  # built but not running: nothing to keep up to date
    async with trio.open_nursery() as nursery:
        await nursery.start(acc.run)
        assert client.observers == [acc._on_write]
        nursery.cancel_scope.cancel()
    assert client.observers == []  # a stopped accumulator leaves nothing behind


# -- issue 9: stuck relists, re-created objects, Forbidden after a good list ----------------


async def test_stuck_relist_does_not_silence_other_queries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(max_interval=1.0) as (acc, client):
        cm = await bootstrap(client, obj("a", 1))
        snap = Snap()
        await acc.changed()
        acc.update(snap)
        widgets = await client.sink("widgets")
        await cm.begin_list()  # a relist after a 410 that does not complete
        await cm.list_page(page([obj("b", 7)], 7))  # half applied
        await widgets.feed(event("ADDED", obj("w", 8, kind="Widget")))
        assert await notified_within(acc, 1.5)
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert [(d.query, d.type, d.key.name) for d in deltas] == [("widgets", DeltaType.ADD, "w")]
        assert names(snap.cms) == [("default", "a")]  # the last consistent view
        # A relist under way is not a readiness problem, but the query is not known either.
        assert acc.not_ready_reason() is None
        assert acc.status("cms").state is QueryState.RELISTING and not acc.status("cms").known
        assert acc.problems() == {}
        # The relist fails, and is retried by the watch loop: readiness names query and error.
        assert isinstance(cm, StoreSink)
        for _ in range(3):
            cm.list_failed(errors.InternalError(500, "InternalError", "etcd is down"), 1.0)
            await cm.begin_list()
        reason = acc.not_ready_reason()
        assert reason == "cms: relist failed 3x, last: 500 InternalError: etcd is down"
        assert acc.problems() == {"cms": "relist failed 3x, last: 500 InternalError: etcd is down"}
        assert metric("nodeagent_accumulator_list_failures_total", query="cms") >= 3
        await widgets.feed(event("MODIFIED", obj("w", 9, kind="Widget")))
        assert await notified_within(acc, 1.5)
        assert acc.update(snap, deltas)
        assert [(d.query, d.type) for d in deltas] == [("widgets", DeltaType.UPDATE)]
        # The relist completes at last: its difference is offered, readiness is clear.
        await cm.list_page(page([obj("b", 7)], 10))
        await cm.end_list("10")
        assert await notified_within(acc, 1.5)
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name) for d in deltas] == [
            (DeltaType.DELETE, "a"),
            (DeltaType.ADD, "b"),
        ]
        assert acc.not_ready_reason() is None and acc.status("cms").known


async def test_first_snapshot_waits_for_a_relist_begun_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, obj("a", 1))
        await cm.begin_list()  # a 410 before the consumer ever looked
        await cm.list_page(page([obj("b", 2)], 2))
        assert not await notified_within(acc, 30)
        assert not acc.update(Snap())  # half a relist is never the first snapshot
        await cm.end_list("2")
        await acc.changed()
        snap = Snap()
        assert acc.update(snap)
        assert names(snap.cms) == [("default", "b")]


async def test_first_list_failures_are_reported(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as (acc, client):
        cm = await client.sink("configmaps")
        await cm.begin_list()
        assert isinstance(cm, StoreSink)
        cm.list_failed(errors.ServiceUnavailable(503, "ServiceUnavailable", "starting"), 0.5)
        assert (
            acc.problems()["cms"]
            == "not synced (list failed 1x, last: 503 ServiceUnavailable: starting)"
        )
        assert acc.status("widgets") == QueryStatus("widgets", QueryState.SYNCING, "not synced")


def replaced_cm(name: str, rv: int, uid: str, **data: str) -> dict[str, Any]:
    return obj(name, rv, uid=uid, data=data)


async def test_recreated_object_is_a_delete_and_an_add(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as (acc, client):
        cm = await bootstrap(client, replaced_cm("a", 1, "uid-1", v="old"), obj("b", 2))
        snap = Snap()
        acc.update(snap)
        await cm.feed(
            event("DELETED", replaced_cm("a", 3, "uid-1", v="old"))
            + event("ADDED", replaced_cm("a", 4, "uid-2", v="new"))
            + event("MODIFIED", obj("b", 5))
        )
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name, d.resource_version) for d in deltas] == [
            (DeltaType.DELETE, "a", "1"),
            (DeltaType.ADD, "a", "4"),
            (DeltaType.UPDATE, "b", "5"),
        ]
        assert deltas[0].obj.metadata.uid == "uid-1" and deltas[0].obj.data == {"v": "old"}
        assert deltas[1].obj.metadata.uid == "uid-2" and deltas[1].obj.data == {"v": "new"}
        assert snap.cms[ObjectKey("default", "a")].metadata.uid == "uid-2"
        assert metric("nodeagent_accumulator_objects", query="cms") == 2
        # Re-created while the watch was away: the relist shows another uid under the name.
        await cm.begin_list()
        await cm.list_page(page([replaced_cm("a", 9, "uid-3"), obj("b", 5)], 9))
        await cm.end_list("9")
        assert acc.update(snap, deltas)
        assert [(d.type, d.key.name, d.obj.metadata.uid) for d in deltas] == [
            (DeltaType.DELETE, "a", "uid-2"),
            (DeltaType.ADD, "a", "uid-3"),
        ]
        # Own delete and re-create through the agent's client (read-your-writes) alike.
        client.write(write("delete", None, "a"))
        client.write(write("create", replaced_cm("a", 12, "uid-4"), "a"))
        assert acc.update(snap, deltas)
        assert [(d.type, d.obj.metadata.uid) for d in deltas] == [
            (DeltaType.DELETE, "uid-3"),
            (DeltaType.ADD, "uid-4"),
        ]


async def test_forbidden_after_a_good_list_serves_empty(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(forbidden_retry=100) as (acc, client):
        await bootstrap(client, obj("a", 1), obj("b", 2))
        snap = Snap()
        await acc.changed()
        acc.update(snap)
        client.write(write("create", obj("own", 3), "own"))  # not yet confirmed by the watch
        acc.update(snap)
        assert len(snap.cms) == 3
        client.revoke("configmaps")  # RBAC revoked; the relist is Forbidden
        # Issue 24 s5: at first taken for an apiserver that has just restarted (its authorizer
        # refuses until its caches sync): the last state is kept, not known, retried soon.
        await trio.sleep(10)
        st = acc.status("cms")
        assert st.state is QueryState.RELISTING and not st.known
        assert st.reason is not None and "403 Forbidden" in st.reason, st.reason
        assert acc.unready_reason() is None
        assert not acc.update(snap) and len(snap.cms) == 3
        # Refused for longer than accumulator.unknown_bound (120 s): served as empty, at the
        # first retry past it (retries double up to forbidden_retry, 100 s here).
        await trio.sleep(105)
        assert acc.status("cms").state is QueryState.RELISTING
        await trio.sleep(120 + 100 - 105)
        assert acc.status("cms").state is QueryState.FORBIDDEN
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert len(snap.cms) == 0
        assert sorted((d.type, d.key.name) for d in deltas) == [
            (DeltaType.DELETE, "a"),
            (DeltaType.DELETE, "b"),
            (DeltaType.DELETE, "own"),
        ]
        st = acc.status("cms")
        assert st.state is QueryState.FORBIDDEN and not st.known
        assert st.reason == "list forbidden: cannot list configmaps"
        assert acc.not_ready_reason() == "cms: list forbidden: cannot list configmaps"
        assert metric("nodeagent_accumulator_forbidden", query="cms") == 1
        # Writes seen meanwhile do not make it look known again.
        client.write(write("create", obj("c", 4), "c"))
        assert not acc.update(snap) and len(snap.cms) == 0
        # Access restored: the next attempt lists for real, within forbidden_retry (served as
        # empty as early as 120 s after the revocation, an attempt may have fallen just before
        # the restoration at 230 s and been refused again: the next is 100 s after that one).
        restored_at = trio.current_time()
        client.forbidden.discard("configmaps")
        cm = await client.sink("configmaps")
        assert trio.current_time() - restored_at <= 100
        await synced(cm, obj("a", 1), obj("c", 4), rv=5)
        await acc.changed()
        assert acc.update(snap, deltas)
        assert names(snap.cms) == [("default", "a"), ("default", "c")]
        assert acc.status("cms").known and acc.not_ready_reason() is None
        assert metric("nodeagent_accumulator_forbidden", query="cms") == 0


async def test_stuck_relist_through_the_watch_loop(autojump_clock: trio.testing.MockClock) -> None:
    # The real client and watch loop over an in-process fake apiserver: ConfigMaps get a 410,
    # then every relist fails; Secrets keep changing meanwhile.
    cms, secrets = FakeCluster(), FakeCluster()
    cms.objects = {"a": "1"}
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    cms.scripts = [[line("ERROR", expired)]]
    secret_event = trio.Event()

    async def server(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/configmaps"):
            if cms.lists:  # every list after the first fails
                cms.list_errors = [status(500, "InternalError", "etcdserver: request timed out")]
            return await cms(request)
        if request.url.params.get("watch") == "true" and not secrets.watches:
            await secret_event.wait()
            secrets.scripts = [[line("ADDED", kube_obj("s", "20"))]]
        return await secrets(request)

    queries: list[Query[Any]] = [
        Query("cms", "v1", CONFIGMAPS, namespace="ns"),
        Query("secrets", "v1", SECRETS, namespace="ns"),
    ]

    @dataclass
    class View:
        cms: ObjectMap[Any] = field(default_factory=ObjectMap)
        secrets: ObjectMap[Any] = field(default_factory=ObjectMap)

    async with mock_client(server, max_attempts=1) as client, trio.open_nursery() as nursery:
        acc = Accumulator(client, queries, AccumulatorSettings())
        await nursery.start(acc.run)
        view = View()
        await acc.changed()
        acc.update(view)
        await cms.wait(lambda: len(cms.lists) >= 4)  # the relist has failed three times
        secret_event.set()
        with trio.fail_after(5):
            await acc.changed()
        assert acc.update(view)
        assert [k.name for k in view.secrets] == ["s"] and [k.name for k in view.cms] == ["a"]
        reason = acc.not_ready_reason()
        assert reason is not None and reason.startswith("cms: relist failed ")
        assert reason.endswith("last: 500 InternalError: etcdserver: request timed out")
        assert acc.status("cms").state is QueryState.RELISTING
        nursery.cancel_scope.cancel()
