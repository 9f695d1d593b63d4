"""The report store's grace swapped at run time (a config reload): a plugin stopping after the
change keeps its report for the new grace, without a restart."""

from __future__ import annotations

import msgspec
import trio
import trio.testing

from nodeagent.core.latest import LatestValue
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.reporter.store import ReportStore
from tests.unit.reporter.test_store import GRACE, Channel, Clock, inline, settle


async def test_a_new_grace_applies_to_a_plugin_stopping_after_the_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    channel = Channel()
    live = LatestValue(ReporterSettings(grace=GRACE, sync_interval=5.0))
    store = ReportStore(channel.latest, live, None, clock=Clock(), run_sync=inline)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        channel.send("a", 1)
        await settle()
        live.set(msgspec.structs.replace(live.value, grace=20.0))
        channel.mark("a", live=False)
        await settle()
        await trio.sleep(19)
        assert "a" in store.latest.value
        await trio.sleep(2)
        assert "a" not in store.latest.value  # after the new 20 s, not the old 300 s
        nursery.cancel_scope.cancel()
