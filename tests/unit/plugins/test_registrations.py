"""The registration table alone (plugins/registrations.py): the newest live registration of a
name serves, the older ones stand by, and a name whose registrations all left is forgotten its
grace after, unless it registers again first."""

from __future__ import annotations

import trio
import trio.testing

from nodeagent.plugins.handler import PluginEndpoint
from nodeagent.plugins.registrations import NameEntry, RegistrationTable

GRACE = 300.0


def endpoint(name: str, socket: str) -> PluginEndpoint:
    return PluginEndpoint(name, "ReporterPlugin", socket, socket, ("v1alpha1",))


def test_the_newest_registration_serves_and_an_older_one_stands_by() -> None:
    table: RegistrationTable[NameEntry] = RegistrationTable(NameEntry, GRACE)
    old, new = endpoint("p", "/r/old.sock"), endpoint("p", "/r/new.sock")
    entry = table.add(old)
    assert table.add(new) is entry
    assert entry.registrations == [old, new]
    # The same socket registering again is one registration, now the newest.
    table.add(old)
    assert entry.registrations == [new, old]
    assert table.remove(new) == (entry, False)  # a standby left
    assert table.remove(old) == (entry, True)  # the serving one left
    assert not entry.registered
    assert table.remove(endpoint("other", "/r/x.sock")) is None


async def test_a_name_that_left_is_forgotten_its_grace_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table: RegistrationTable[NameEntry] = RegistrationTable(NameEntry, GRACE)
    forgotten: list[tuple[str, float]] = []

    def forget(name: str) -> None:
        forgotten.append((name, trio.current_time()))
        table.drop(name)

    gone, back = endpoint("gone", "/r/gone.sock"), endpoint("back", "/r/back.sock")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(table.expire, forget)
        for plugin in (gone, back):
            entry = table.add(plugin)
            table.remove(plugin)
            table.left(entry, trio.current_time())
        await trio.sleep(GRACE / 2)
        table.add(back)  # registered again within its grace: kept
        await trio.sleep(GRACE)
        nursery.cancel_scope.cancel()
    assert forgotten == [("gone", GRACE)]
    assert list(table.entries) == ["back"]


async def test_dropping_a_name_keeps_a_lock_someone_holds() -> None:
    table: RegistrationTable[NameEntry] = RegistrationTable(NameEntry, GRACE)
    plugin = endpoint("p", "/r/p.sock")
    table.add(plugin)
    lock = table.lock("p")
    async with lock:
        table.drop("p")
        assert table.lock("p") is lock  # a later register of the name waits for the holder
    table.add(plugin)
    table.drop("p")
    assert table.lock("p") is not lock
