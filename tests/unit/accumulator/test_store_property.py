"""Hypothesis drives random event sequences through the Rust store and the Python reference
and requires identical observable behaviour: feed results, pending counts, held objects,
snapshots and deltas. A consumer applying the deltas in order must end with exactly the shown
objects, and an update never changes an object's uid (a re-created object is a delete + add)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent._native import Store
from tests.support.store_reference import RefStore
from tests.unit.accumulator.helpers import bookmark, dump, error_event, event, obj, page

KEYS = [(ns, n) for ns in ("a", "b") for n in ("x", "y", "z")] + [("", "x")]
key_idx = st.integers(0, len(KEYS) - 1)
uids = st.sampled_from(["u1", "u2"])
labels = st.sampled_from(["show", "hide", "bad"])
rv_step = st.integers(-2, 3)  # negative: an older (or equal) version than the newest

watch_event = st.tuples(
    st.just("event"),
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    key_idx,
    rv_step,
    uids,
    labels,
)
ops = st.one_of(
    watch_event,
    watch_event,
    watch_event,
    st.tuples(st.just("bookmark")),
    st.tuples(
        st.just("garbage"), st.sampled_from([b"{oops", b'{"type":"ADDED","object":{}}', b"[]"])
    ),
    st.tuples(st.just("error")),
    st.tuples(st.just("flush"), st.lists(st.integers(0, 400), max_size=4)),
    st.tuples(st.just("end_stream")),
    st.tuples(
        st.just("relist"),
        st.lists(st.tuples(key_idx, rv_step, uids, labels), max_size=6),
        st.booleans(),
    ),
    st.tuples(st.just("local"), key_idx, rv_step, uids, labels),
    st.tuples(st.just("local_delete"), key_idx),
    st.tuples(st.just("expire"), st.integers(0, 30)),
    st.tuples(st.just("drain"), st.booleans()),
)


def accept(ns: str, name: str, raw: bytes) -> bool | None:
    if b'"p":"hide"' in raw:
        return False
    if b'"p":"bad"' in raw:
        return None
    return True


class Driver:
    def __init__(self) -> None:
        self.rust = Store()
        self.ref = RefStore()
        self.rv = 100
        self.buf = b""
        self.now = 0.0
        # What a consumer applying the deltas in order holds: (namespace, name) -> uid.
        self.consumer: dict[tuple[str, str], str] = {}

    def both(self, method: str, *args: Any) -> Any:
        a = getattr(self.rust, method)(*args)
        b = getattr(self.ref, method)(*args)
        return a, b

    def next_rv(self, step: int) -> int:
        self.rv += 1
        return self.rv + min(step, 0) * 3

    def make(self, k: int, step: int, uid: str, label: str) -> dict[str, Any]:
        ns, name = KEYS[k]
        return obj(name, self.next_rv(step), ns or None, uid=uid, labels={"p": label})

    def feed(self, data: bytes) -> None:
        a, b = self.both("feed", data)
        assert a[:3] == b[:3]
        assert len(a[3]) == len(b[3])

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "event":
            _, ty, k, step, uid, label = op
            self.buf += event(ty, self.make(k, step, uid, label))
        elif kind == "bookmark":
            self.buf += bookmark(self.rv)
        elif kind == "garbage":
            self.buf += op[1] + b"\n"
        elif kind == "error":
            self.buf += error_event()
        elif kind == "flush":
            cuts = sorted({c % (len(self.buf) + 1) for c in op[1]})
            start = 0
            for c in [*cuts, len(self.buf)]:
                self.feed(self.buf[start:c])
                start = c
            self.buf = b""
        elif kind == "end_stream":
            self.both("end_stream")
        elif kind == "relist":
            _, items, split = op
            docs = {}
            for k, step, uid, label in items:
                docs[KEYS[k]] = self.make(k, step, uid, label)
            docs_list = list(docs.values())
            self.both("begin_list")
            pages = (
                [docs_list[: len(docs_list) // 2], docs_list[len(docs_list) // 2 :]]
                if split
                else [docs_list]
            )
            for p in pages:
                a, b = self.both("list_page", page(p, self.rv))
                assert a == b
            a, b = self.both("end_list", str(self.rv))
            assert a == b
        elif kind == "local":
            _, k, step, uid, label = op
            a, b = self.both("apply_local", dump(self.make(k, step, uid, label)), self.now + 10)
            assert a == b
        elif kind == "local_delete":
            ns, name = KEYS[op[1]]
            a, b = self.both("delete_local", ns, name, self.now + 10)
            assert a == b
        elif kind == "expire":
            self.now += op[1]
            a, b = self.both("expire", self.now)
            assert a == b
        elif kind == "drain":
            fn = accept if op[1] else None
            a, b = self.both("drain", fn)
            assert sorted(a) == sorted(b)
            self.consume(a)
        self.check()

    def consume(self, deltas: list[tuple[int, str, str, str, bytes | None]]) -> None:
        for kind, ns, name, _rv, raw in deltas:
            key = (ns, name)
            if kind == 2:
                assert key in self.consumer
                del self.consumer[key]
                continue
            assert raw is not None
            uid = json.loads(raw)["metadata"]["uid"]
            if kind == 0:
                assert key not in self.consumer
            else:
                assert self.consumer[key] == uid, "an update must not hide a re-created object"
            self.consumer[key] = uid
        assert sorted(self.consumer) == sorted(self.rust.shown_keys())

    def check(self) -> None:
        assert self.rust.pending() == self.ref.pending()
        assert len(self.rust) == len(self.ref)
        for ns, name in KEYS:
            assert self.rust.get(ns, name) == self.ref.get(ns, name)
        assert sorted(self.rust.shown_keys()) == sorted(self.ref.shown_keys())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=60))
def test_rust_store_matches_reference(program: list[tuple[Any, ...]]) -> None:
    d = Driver()
    for op in program:
        d.apply(op)
    d.apply(("flush", []))
    d.apply(("drain", True))
