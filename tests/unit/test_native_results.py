"""The Rust boundary's results are named and typed (issue 23 s3): `Store.feed` a WatchFeed,
`Store.drain` Deltas whose kind is a DeltaKind (still the int it was), and a list of slices
that fails to decode or canonicalise raises SliceError naming every bad one by index."""

from __future__ import annotations

import json

import pytest

from nodeagent import _native


def _event(kind: str, name: str, rv: str) -> bytes:
    obj = {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": name}}
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def test_feed_is_a_named_tuple_with_the_error_named_too() -> None:
    store = _native.Store()
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    got = store.feed(
        _event("ADDED", "a", "5")
        + b"not json\n"
        + json.dumps({"type": "ERROR", "object": status}).encode()
        + b"\n"
    )
    assert isinstance(got, _native.WatchFeed)
    assert got.resource_version == "5"
    assert got.events == 1
    assert len(got.malformed) == 1
    assert got.error == _native.WatchError(410, "Expired", "too old")
    rv, _error, events, _malformed = got  # still a tuple
    assert (rv, events) == ("5", 1)


def test_deltas_are_named_and_their_kind_an_int_enum() -> None:
    store = _native.Store()
    store.feed(_event("ADDED", "a", "1") + _event("ADDED", "b", "2"))
    store.drain()
    store.feed(_event("MODIFIED", "a", "3") + _event("DELETED", "b", "4"))
    deltas = sorted(store.drain(), key=lambda d: d.name)
    assert [(d.kind, d.name) for d in deltas] == [
        (_native.DeltaKind.UPDATE, "a"),
        (_native.DeltaKind.DELETE, "b"),
    ]
    assert deltas[0].resource_version == "3"
    assert all(isinstance(d, _native.Delta) for d in deltas)
    assert deltas[1].raw is None and deltas[0].raw is not None
    assert deltas[0].kind == 1 and ("add", "update", "delete")[deltas[1].kind] == "delete"


def _slice(name: str) -> bytes:
    spec = {"driver": "d", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
    return json.dumps(
        {"metadata": {"name": name, "uid": name, "resourceVersion": "1"}, "spec": spec}
    ).encode()


def test_a_bad_slice_raises_slice_error_with_every_bad_index() -> None:
    objects = [_slice("s0"), b"{", _slice("s2"), b'{"metadata": {}}']
    with pytest.raises(_native.SliceError) as info:
        _native.prepare_observed(objects)
    assert isinstance(info.value, ValueError)
    assert info.value.index == 1
    assert [i for i, _ in info.value.errors] == [1, 3]
    assert str(info.value) == info.value.errors[0][1]
    assert "observed slice 1" in str(info.value)
    # The rest prepare in one more call.
    bad = {i for i, _ in info.value.errors}
    good = _native.prepare_observed([o for i, o in enumerate(objects) if i not in bad])
    assert [p.name for p in good] == ["s0", "s2"]


def test_a_bad_desired_spec_raises_slice_error_too() -> None:
    with pytest.raises(_native.SliceError) as info:
        _native.prepare_desired([b"[]"])
    assert info.value.index == 0
