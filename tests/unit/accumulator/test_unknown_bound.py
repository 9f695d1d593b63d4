"""A watch that cannot be kept, bounded (issue 21 section 4): `Accumulator.unready_reason()` names
a query known before and not since (relisting after a 410, its relist failing) only once that has
lasted longer than `accumulator.unknown_bound`, so a brief control-plane restart does not make
its component not ready; a query never listed or Forbidden is named at once."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.accumulator import Accumulator, AccumulatorSettings, Query, QueryState
from nodeagent.core.errors import ConfigError
from nodeagent.kube import errors
from nodeagent.kube.resource import CONFIGMAPS
from tests.support.fake_watch import FakeClient
from tests.unit.accumulator.helpers import obj, page

QUERY: Query[Any] = Query("cms", "v1", CONFIGMAPS, namespace="ns")


async def test_relisting_is_a_problem_only_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = FakeClient()
    acc = Accumulator(
        client, [QUERY], AccumulatorSettings(unknown_bound=30), watch=client.run_watch
    )
    async with trio.open_nursery() as n:
        await n.start(acc.run)
        sink = await client.sink("configmaps")
        # Never listed: named at once.
        assert acc.unready_reason() == "cms: not synced"
        await sink.begin_list()
        await sink.list_page(page([obj("a", 5, "ns")], 10))
        await sink.end_list("10")
        assert acc.unready_reason() is None
        # A 410: events missing, the relist fails again and again.
        sink.events_missing("gone")  # type: ignore[attr-defined]
        failed = errors.ApiError(503, "ServiceUnavailable", "etcd is down")
        for _ in range(3):
            await trio.sleep(9)
            sink.list_failed(failed, 9)  # type: ignore[attr-defined]
        assert not acc.status("cms").known
        assert acc.unready_reason() is None  # 27 s: within the bound
        assert acc.problems() == {
            "cms": "relist failed 3x, last: 503 ServiceUnavailable: etcd is down"
        }
        await trio.sleep(4)
        reason = acc.unready_reason()
        assert reason == (
            "cms: relist failed 3x, last: 503 ServiceUnavailable: etcd is down "
            "(not known for 31s, bound 30s)"
        )
        # Listed again: known, and the bound starts afresh at the next gap.
        await sink.begin_list()
        await sink.list_page(page([obj("a", 5, "ns")], 12))
        await sink.end_list("12")
        assert acc.unready_reason() is None
        sink.events_missing("gone")  # type: ignore[attr-defined]
        await trio.sleep(29)
        assert acc.unready_reason() is None
        n.cancel_scope.cancel()


async def test_a_forbidden_first_list_is_a_problem_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = FakeClient()
    client.forbidden.add("configmaps")
    acc = Accumulator(client, [QUERY], AccumulatorSettings(), watch=client.run_watch)
    async with trio.open_nursery() as n:
        await n.start(acc.run)
        await trio.testing.wait_all_tasks_blocked()
        reason = acc.unready_reason()
        assert reason is not None and reason.startswith("cms: list forbidden"), reason
        n.cancel_scope.cancel()


async def test_a_forbidden_relist_is_a_problem_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Issue 24 s5: a restarted apiserver refuses lists until its authorizer's caches are
    # synced; a query known before keeps its state and is retried soon, jittered, and is
    # served as Forbidden (empty) only once it has not been known for unknown_bound.
    client = FakeClient()
    acc = Accumulator(
        client, [QUERY], AccumulatorSettings(unknown_bound=30), watch=client.run_watch
    )
    async with trio.open_nursery() as n:
        await n.start(acc.run)
        sink = await client.sink("configmaps")
        await sink.begin_list()
        await sink.end_list("1")
        client.revoke("configmaps")
        await trio.sleep(29)
        assert acc.unready_reason() is None
        assert acc.status("cms").state is QueryState.RELISTING
        await trio.sleep(2)
        # Past the bound: named (as not known, or as Forbidden if a retry came since).
        reason = acc.unready_reason()
        assert reason is not None, reason
        assert "not known for 31s, bound 30s" in reason or "list forbidden" in reason, reason
        # The authorizer is back before the bound runs out at the next retry: known again.
        client.forbidden.clear()
        sink = await client.sink("configmaps")
        await sink.begin_list()
        await sink.end_list("2")
        assert acc.unready_reason() is None and acc.status("cms").known
        # Refused again, for good this time: served as empty past the bound.
        client.revoke("configmaps")
        # The bound, then at most one retry delay (doubling from 1 s, jittered: <= 64 s).
        await trio.sleep(30 + 64)
        st = acc.status("cms")
        assert st.state is QueryState.FORBIDDEN, st
        reason = acc.unready_reason()
        assert reason is not None and reason.startswith("cms: list forbidden"), reason
        n.cancel_scope.cancel()


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")])
def test_unknown_bound_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ConfigError, match=r"accumulator\.unknown_bound"):
        AccumulatorSettings(unknown_bound=value).validate()
