"""The store's rules, checked on the Rust store and on the Python reference alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from nodeagent._native import Store
from tests.support.store_reference import RefStore
from tests.unit.accumulator.helpers import bookmark, dump, error_event, event, obj, page

ADD, UPDATE, DELETE = 0, 1, 2


@pytest.fixture(params=["rust", "reference"])
def store(request: pytest.FixtureRequest) -> Any:
    return Store() if request.param == "rust" else RefStore()


def kinds(
    deltas: Sequence[tuple[int, str, str, str, bytes | None]],
) -> list[tuple[int, str, str, str]]:
    return sorted((k, ns, n, rv) for k, ns, n, rv, _ in deltas)


def test_event_split_anywhere_is_applied_once_complete(store: Any) -> None:
    data = event("ADDED", obj("a", 5)) + bookmark(7)
    for i in range(len(data)):
        s = type(store)()
        r1 = s.feed(data[:i])
        r2 = s.feed(data[i:])
        assert r1[2] + r2[2] == 2
        assert (r2[0] or r1[0]) == "7"
        assert s.get("default", "a") == dump(obj("a", 5))


def test_end_stream_drops_partial_line(store: Any) -> None:
    line = event("ADDED", obj("a", 5))
    store.feed(line[:10])
    store.end_stream()
    assert store.feed(line[10:])[3]  # the tail alone is malformed
    assert store.get("default", "a") is None
    assert store.pending() == 0


def test_error_event_is_reported_and_rest_of_chunk_ignored(store: Any) -> None:
    chunk = (
        event("ADDED", obj("a", 5))
        + error_event(410, "Expired", "gone")
        + event("ADDED", obj("b", 6))
    )
    rv, err, n, malformed = store.feed(chunk)
    assert (rv, err, n, malformed) == ("5", (410, "Expired", "gone"), 1, [])
    assert store.get("default", "b") is None


def test_error_event_with_object_before_type() -> None:
    status = b'{"kind":"Status","code":500,"reason":"InternalError","message":"x"}'
    line = b'{"object":' + status + b',"type":"ERROR"}\n'
    assert Store().feed(line)[1] == (500, "InternalError", "x")


@pytest.mark.parametrize(
    "line",
    [
        b"{not json}",
        b'{"type":"ADDED"}',
        b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"1"}}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}',
        b'{"type":"ADDED","object":[1]}',
        b'{"type":"WHAT","object":{}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"1"}}',
        b'{"type":"ADDED","object":{"metadata":{"name":"a/b","resourceVersion":"1"}}}',
        b'["ADDED"]',
    ],
)
def test_malformed_event_is_reported_and_store_untouched(store: Any, line: bytes) -> None:
    store.feed(event("ADDED", obj("keep", 3)))
    store.drain()
    _rv, err, n, malformed = store.feed(line + b"\n" + event("MODIFIED", obj("keep", 4)))
    assert len(malformed) == 1 and n == 1 and err is None
    assert kinds(store.drain()) == [(UPDATE, "default", "keep", "4")]


def test_malformed_messages_are_clear() -> None:
    s = Store()
    msgs = s.feed(b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"1"}}}\n{"x":}\n')[3]
    assert msgs[0] == "object has no metadata.name"
    assert msgs[1].startswith("invalid JSON at byte 5")


def test_same_resource_version_gives_no_delta_and_no_pending(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 5)))
    assert kinds(store.drain()) == [(ADD, "default", "a", "5")]
    store.feed(event("MODIFIED", obj("a", 5)))
    assert store.pending() == 0
    assert store.drain() == []


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # add + update = add
        ([("ADDED", 1), ("MODIFIED", 2)], [(ADD, "2")]),
        # add + delete = nothing
        ([("ADDED", 1), ("DELETED", 2)], []),
    ],
)
def test_delta_algebra_from_nothing(
    store: Any, events: list[tuple[str, int]], expected: Any
) -> None:
    for ty, rv in events:
        store.feed(event(ty, obj("a", rv)))
    assert [(k, rv) for k, _, _, rv in kinds(store.drain())] == expected


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # update + delete = delete (with the last shown resourceVersion)
        ([("MODIFIED", 2), ("DELETED", 3)], [(DELETE, "1")]),
        # delete + add = update
        ([("DELETED", 2), ("ADDED", 3)], [(UPDATE, "3")]),
        ([("MODIFIED", 2), ("MODIFIED", 3)], [(UPDATE, "3")]),
    ],
)
def test_delta_algebra_from_shown(store: Any, events: list[tuple[str, int]], expected: Any) -> None:
    store.feed(event("ADDED", obj("a", 1)))
    store.drain()
    for ty, rv in events:
        store.feed(event(ty, obj("a", rv)))
    assert [(k, rv) for k, _, _, rv in kinds(store.drain())] == expected


def test_namespaces_do_not_collide(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 1, "ns1")) + event("ADDED", obj("a", 2, "ns2")))
    store.feed(event("ADDED", obj("a", 3, None, kind="Node")))
    assert kinds(store.drain()) == [
        (ADD, "", "a", "3"),
        (ADD, "ns1", "a", "1"),
        (ADD, "ns2", "a", "2"),
    ]
    store.feed(event("DELETED", obj("a", 4, "ns1")))
    assert kinds(store.drain()) == [(DELETE, "ns1", "a", "1")]
    assert store.get("ns2", "a") is not None


def test_predicate_runs_only_for_changed_objects(store: Any) -> None:
    seen: list[str] = []

    def accept(ns: str, name: str, raw: bytes) -> bool:
        seen.append(name)
        return b'"hide"' not in raw

    store.feed(event("ADDED", obj("a", 1)) + event("ADDED", obj("b", 2, labels={"x": "hide"})))
    assert kinds(store.drain(accept)) == [(ADD, "default", "a", "1")]
    assert sorted(seen) == ["a", "b"]
    seen.clear()
    store.feed(event("MODIFIED", obj("b", 2, labels={"x": "hide"})))  # same rv: not judged
    assert store.drain(accept) == [] and seen == []
    # b starts passing: add; a stops passing: delete. Excluded changes give no delta.
    store.feed(
        event("MODIFIED", obj("b", 3)) + event("MODIFIED", obj("a", 4, labels={"x": "hide"}))
    )
    assert kinds(store.drain(accept)) == [(ADD, "default", "b", "3"), (DELETE, "default", "a", "1")]
    store.feed(event("MODIFIED", obj("a", 5, labels={"x": "hide"})) + event("DELETED", obj("a", 6)))
    assert store.drain(accept) == []
    assert sorted(store.shown_keys()) == [("default", "b")]


def test_rejected_object_keeps_last_good_version(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 1)))
    store.drain()
    store.feed(event("MODIFIED", obj("a", 2, labels={"x": "bad"})))
    assert store.drain(lambda ns, n, raw: None if b"bad" in raw else True) == []
    assert store.shown_keys() == [("default", "a")]
    store.feed(event("MODIFIED", obj("a", 3)))
    assert kinds(store.drain(lambda ns, n, raw: True)) == [(UPDATE, "default", "a", "3")]


def test_accept_raising_drains_nothing() -> None:
    s = Store()
    s.feed(event("ADDED", obj("a", 1)))

    def boom(ns: str, name: str, raw: bytes) -> bool:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        s.drain(boom)
    assert s.pending() == 1
    assert kinds(s.drain()) == [(ADD, "default", "a", "1")]


def test_list_items_get_kind_and_api_version(store: Any) -> None:
    store.begin_list()
    assert store.list_page(page([obj("a", 1)], rv=9)) == (1, [])
    store.end_list("9")
    (delta,) = store.drain()
    assert delta[4] == dump(obj("a", 1))


def test_relist_reports_exact_difference(store: Any) -> None:
    store.begin_list()
    store.list_page(page([obj("a", 1), obj("b", 2)]))
    store.list_page(page([obj("c", 3)]))
    store.end_list("3")
    assert len(store.drain()) == 3
    store.begin_list()
    store.list_page(page([obj("a", 1), obj("b", 7), obj("d", 8)]))
    assert store.end_list("9") == 1
    assert kinds(store.drain()) == [
        (ADD, "default", "d", "8"),
        (UPDATE, "default", "b", "7"),
        (DELETE, "default", "c", "3"),
    ]


def test_malformed_page_deletes_nothing(store: Any) -> None:
    store.begin_list()
    store.list_page(page([obj("a", 1), obj("b", 2)]))
    store.end_list("2")
    store.drain()
    store.begin_list()
    with pytest.raises(ValueError):
        store.list_page(b'{"items":[')
    assert store.end_list("5") == 0
    assert store.drain() == []


def test_malformed_list_item_is_reported_and_deletes_nothing(store: Any) -> None:
    store.begin_list()
    store.list_page(page([obj("a", 1), obj("b", 2)]))
    store.end_list("2")
    store.drain()
    store.begin_list()
    bad = page([obj("a", 1)])[:-2] + b',{"metadata":{"resourceVersion":"4"}}]}'
    n, malformed = store.list_page(bad)
    assert n == 1 and len(malformed) == 1
    assert store.end_list("5") == 0
    assert store.drain() == []


def test_local_write_shown_until_watch_catches_up(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 10, data={"v": "0"})))
    store.drain()
    assert store.apply_local(dump(obj("a", 12, data={"v": "2"})), 100.0)
    assert kinds(store.drain()) == [(UPDATE, "default", "a", "12")]
    # The watch delivers the older write first: the local copy stays.
    store.feed(event("MODIFIED", obj("a", 11, data={"v": "1"})))
    assert store.drain() == []
    assert b'"2"' in store.get("default", "a")
    # Then the same resourceVersion: the override is confirmed, no delta.
    store.feed(event("MODIFIED", obj("a", 12, data={"v": "2"})))
    assert store.drain() == [] and store.pending() == 0
    assert store.expire(1000.0) == 0


def test_stale_local_write_is_ignored(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 10)))
    store.drain()
    assert not store.apply_local(dump(obj("a", 10)), 100.0)
    assert not store.apply_local(dump(obj("a", 9)), 100.0)
    assert store.pending() == 0


def test_local_create_expires_if_never_confirmed(store: Any) -> None:
    assert store.apply_local(dump(obj("new", 5)), 100.0)
    assert kinds(store.drain()) == [(ADD, "default", "new", "5")]
    assert store.expire(99.0) == 0
    assert store.expire(100.0) == 1
    assert kinds(store.drain()) == [(DELETE, "default", "new", "5")]
    assert len(store) == 0


def test_local_delete_hides_until_watch_confirms(store: Any) -> None:
    store.feed(event("ADDED", obj("a", 10)))
    store.drain()
    assert store.delete_local("default", "a", 100.0)
    assert kinds(store.drain()) == [(DELETE, "default", "a", "10")]
    # A late event for the same object does not resurrect it.
    store.feed(event("MODIFIED", obj("a", 11)))
    assert store.drain() == []
    store.feed(event("DELETED", obj("a", 12)))
    assert store.drain() == []
    # Re-created by someone else (new uid, newer rv): shown again.
    store.feed(event("ADDED", obj("a", 13, uid="other")))
    assert kinds(store.drain()) == [(ADD, "default", "a", "13")]


def test_local_delete_of_unknown_object_is_noop(store: Any) -> None:
    assert not store.delete_local("default", "nope", 1.0)
    assert store.pending() == 0


def test_malformed_local_write_raises_clear_error(store: Any) -> None:
    with pytest.raises(ValueError):
        store.apply_local(b'{"metadata":{"resourceVersion":"1"}}', 1.0)
    with pytest.raises(ValueError):
        store.apply_local(b"{", 1.0)
    assert store.pending() == 0


def test_non_numeric_resource_versions_compare_by_equality(store: Any) -> None:
    store.feed(event("ADDED", obj("a", "abc")))
    store.drain()
    store.feed(event("MODIFIED", obj("a", "abc")))
    assert store.drain() == []
    assert store.apply_local(dump(obj("a", "xyz")), 10.0)
    # Any different watch version wins over a local one it cannot be ordered against.
    store.feed(event("MODIFIED", obj("a", "def")))
    assert kinds(store.drain()) == [(UPDATE, "default", "a", "def")]


def test_memory_usage_counts_object_bytes() -> None:
    s = Store()
    raw = dump(obj("a", 1, data={"k": "x" * 1000}))
    s.feed(event("ADDED", obj("a", 1, data={"k": "x" * 1000})))
    assert len(raw) <= s.memory_usage() < len(raw) + 2000
