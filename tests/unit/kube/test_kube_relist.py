"""The relist difference and the plain-Python sink, against simple reference rules."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from tests.support.informer import EventType, ObjectCache, relist_diff

keys = st.sampled_from([f"k{i}" for i in range(8)])
rvs = st.sampled_from(["1", "2", "3"])
states = st.dictionaries(keys, rvs)


@given(known=states, listed=states)
def test_relist_diff_is_exactly_the_difference(
    known: dict[str, str], listed: dict[str, str]
) -> None:
    diff = relist_diff(known, listed)
    assert set(diff.added) == listed.keys() - known.keys()
    assert set(diff.deleted) == known.keys() - listed.keys()
    assert set(diff.modified) == {k for k in known.keys() & listed.keys() if known[k] != listed[k]}
    # Applying the difference to what was known gives what was listed.
    state = dict(known)
    for k in diff.deleted:
        del state[k]
    for k in diff.added + diff.modified:
        state[k] = listed[k]
    assert state == listed
    assert len(diff.added + diff.modified + diff.deleted) == len(
        set(diff.added) | set(diff.modified) | set(diff.deleted)
    )


def _obj(name: str, rv: str, ns: str = "default") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}, "data": {"v": rv}}


def _line(type: str, obj: dict[str, object]) -> bytes:
    return json.dumps({"type": type, "object": obj}).encode() + b"\n"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[EventType, str, str]] = []

    async def __call__(self, type: EventType, raw: bytes) -> None:
        meta = json.loads(raw)["metadata"]
        self.events.append((type, meta["name"], meta["resourceVersion"]))


ops = st.lists(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]), keys, rvs),
    max_size=25,
)


def _reference(
    start: dict[str, str], operations: list[tuple[str, str, str]]
) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """The informer rules in the plainest form: report only real changes."""
    state = dict(start)
    out = []
    for type, name, rv in operations:
        if type == "BOOKMARK":
            continue
        if type == "DELETED":
            if name in state:
                del state[name]
                out.append(("DELETED", name, rv))
        elif state.get(name) != rv:
            out.append(("ADDED" if name not in state else "MODIFIED", name, rv))
            state[name] = rv
    return out, state


@given(
    listed=states,
    operations=ops,
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
)
async def test_sink_matches_reference_with_chunks_split_anywhere(
    listed: dict[str, str], operations: list[tuple[str, str, str]], cuts: list[int]
) -> None:
    rec = Recorder()
    cache = ObjectCache(rec)
    await cache.begin_list()
    page = {
        "metadata": {"resourceVersion": "1"},
        "items": [_obj(n, rv) for n, rv in listed.items()],
    }
    await cache.list_page(json.dumps(page).encode())
    await cache.end_list("1")
    assert sorted(rec.events) == sorted(("ADDED", n, rv) for n, rv in listed.items())
    rec.events.clear()

    stream = b"".join(
        _line(t, {"metadata": {"resourceVersion": rv}} if t == "BOOKMARK" else _obj(n, rv))
        for t, n, rv in operations
    )
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    newest = None
    count = 0
    for a, b in itertools.pairwise(bounds):
        result = await cache.feed(stream[a:b])
        assert result.error is None
        count += result.events
        newest = result.resource_version or newest
    expected, state = _reference(listed, operations)
    assert rec.events == expected
    assert count == len(operations)
    assert newest == (operations[-1][2] if operations else None)
    assert {k[1]: rv for k, (rv, _) in cache.objects.items()} == state


@given(before=states, after=states)
async def test_relist_reports_exactly_the_difference(
    before: dict[str, str], after: dict[str, str]
) -> None:
    rec = Recorder()
    cache = ObjectCache(rec)
    for listed in (before, after):
        rec.events.clear()
        await cache.begin_list()
        items = [_obj(n, rv) for n, rv in listed.items()]
        # Two pages, as a paged list would give.
        half = len(items) // 2
        for part in (items[:half], items[half:]):
            await cache.list_page(json.dumps({"items": part}).encode())
        await cache.end_list("9")
    diff = relist_diff(before, after)
    got = sorted(rec.events)
    want = sorted(
        [("ADDED", k, after[k]) for k in diff.added]
        + [("MODIFIED", k, after[k]) for k in diff.modified]
        + [("DELETED", k, before[k]) for k in diff.deleted]
    )
    assert got == want


async def test_restarted_list_discards_the_partial_one() -> None:
    rec = Recorder()
    cache = ObjectCache(rec)
    await cache.begin_list()
    await cache.list_page(json.dumps({"items": [_obj("a", "1")]}).encode())
    await cache.begin_list()  # a page failed; the loop lists again from the start
    await cache.list_page(json.dumps({"items": [_obj("b", "1")]}).encode())
    await cache.end_list("1")
    assert rec.events == [("ADDED", "b", "1")]


async def test_error_event_stops_the_chunk_and_same_namespaced_names_differ() -> None:
    rec = Recorder()
    cache = ObjectCache(rec)
    await cache.begin_list()
    await cache.end_list("1")
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    chunk = (
        _line("ADDED", _obj("a", "5", ns="x"))
        + _line("ADDED", _obj("a", "6", ns="y"))
        + _line("ERROR", status)
        + _line("ADDED", _obj("b", "7"))
    )
    result = await cache.feed(chunk)
    assert result.error is not None
    assert (result.error.code, result.error.reason, result.error.message) == (
        410,
        "Expired",
        "too old",
    )
    assert result.resource_version == "6" and result.events == 3
    assert rec.events == [("ADDED", "a", "5"), ("ADDED", "a", "6")]
    assert set(cache.objects) == {("x", "a"), ("y", "a")}


async def test_bad_lines_are_skipped_and_partial_lines_dropped_at_stream_end() -> None:
    rec = Recorder()
    cache = ObjectCache(rec, resource="test")
    await cache.begin_list()
    await cache.end_list("1")
    result = await cache.feed(b"{not json}\n" + _line("ADDED", _obj("a", "2")) + b'{"type":"ADD')
    assert result.resource_version == "2" and result.error is None
    await cache.end_stream()  # the half line belonged to the dead connection
    result = await cache.feed(_line("MODIFIED", _obj("a", "3")))
    assert rec.events == [("ADDED", "a", "2"), ("MODIFIED", "a", "3")]
