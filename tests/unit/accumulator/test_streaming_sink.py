"""The accumulator's sink under a streaming list: initial watch events between begin_list and
end_list are the list (what they do not show is deleted), unless one of them was malformed:
then the relist deletes nothing, as a malformed List page does."""

from __future__ import annotations

import json

from nodeagent._native import Store
from nodeagent.accumulator.sink import StoreSink


def _line(type: str, name: str, rv: str) -> bytes:
    obj = {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}
    return json.dumps({"type": type, "object": obj}).encode() + b"\n"


def _names(store: Store) -> list[str]:
    return [name for name in ("a", "b") if store.get("ns", name) is not None]


async def _held(sink: StoreSink) -> None:
    await sink.begin_list()
    await sink.feed(_line("ADDED", "a", "1") + _line("ADDED", "b", "2"))
    await sink.end_list("2")


async def test_initial_events_are_the_list() -> None:
    sink = StoreSink("q", Store(), lambda: None, 1 << 20)
    await _held(sink)
    await sink.begin_list()
    await sink.feed(_line("ADDED", "a", "1"))
    await sink.end_list("5")
    assert _names(sink.store) == ["a"]


async def test_a_malformed_initial_event_deletes_nothing() -> None:
    sink = StoreSink("q", Store(), lambda: None, 1 << 20)
    await _held(sink)
    await sink.begin_list()
    await sink.feed(_line("ADDED", "a", "1") + b'{"type":"ADDED","object":{"metadata":7}}\n')
    await sink.end_list("5")
    assert _names(sink.store) == ["a", "b"]  # b might be the object we could not read
    assert not sink.listing and sink.synced
