"""A watch that cannot be kept, bounded (issue 21 section 4): `Accumulator.unready_reason()` names
a query known before and not since (relisting after a 410, its relist failing) only once that has
lasted longer than `accumulator.unknown_bound`, so a brief control-plane restart does not make
its component not ready; a query never listed or Forbidden is named at once."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.accumulator import Accumulator, AccumulatorSettings, Query
from nodeagent.core.errors import ConfigError
from nodeagent.kube import errors
from nodeagent.kube.resource import CONFIGMAPS
from tests.unit.accumulator.fakes import FakeClient
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


async def test_forbidden_is_a_problem_at_once(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient()
    acc = Accumulator(client, [QUERY], AccumulatorSettings(), watch=client.run_watch)
    async with trio.open_nursery() as n:
        await n.start(acc.run)
        sink = await client.sink("configmaps")
        await sink.begin_list()
        await sink.end_list("1")
        client.revoke("configmaps")
        await trio.testing.wait_all_tasks_blocked()
        reason = acc.unready_reason()
        assert reason is not None and reason.startswith("cms: list forbidden"), reason
        n.cancel_scope.cancel()


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")])
def test_unknown_bound_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ConfigError, match=r"accumulator\.unknown_bound"):
        AccumulatorSettings(unknown_bound=value).validate()
