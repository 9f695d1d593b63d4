"""`ObservedSlices` on its own (no publisher): the grouping of a snapshot's slices per pool, ours
apart from foreign ones, and the pools a new snapshot changes, property-tested against a plain
model; then `refresh` (own writes, the Node) and `blocked`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.accumulator.model import QueryState, QueryStatus
from nodeagent.resources.observed import MANAGED_BY, ObservedSlices, PoolKey

NODE = "node-a"
DRIVERS = ["gpu.example.com", "nic.example.com"]
POOLS = ["p0", "p1"]
ALL_POOLS = [(d, p) for d in DRIVERS for p in POOLS]


@dataclass(frozen=True)
class Slice:
    name: str
    key: PoolKey
    ours: bool
    rv: str


def raw(s: Slice, owner_uid: str = "node-uid-1") -> bytes:
    labels = {MANAGED_BY[0]: MANAGED_BY[1]} if s.ours else {"app": "other"}
    return msgspec.json.encode(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": s.name,
                "uid": f"uid-{s.name}",
                "resourceVersion": s.rv,
                "labels": labels,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": owner_uid}
                ],
            },
            "spec": {
                "driver": s.key[0],
                "pool": {"name": s.key[1], "generation": 1, "resourceSliceCount": 1},
                "nodeName": NODE,
                "devices": [],
            },
        }
    )


class Source:
    """A `SliceSource` whose snapshots are set by the test."""

    bootstrapped = True

    def __init__(self) -> None:
        self.slices: dict[str, bytes] = {}
        self.node_uid: str | None = "node-uid-1"
        self.unknown: dict[str, QueryStatus] = {}
        self.version = 0
        self._taken = -1

    def show(self, slices: list[Slice]) -> None:
        self.slices = {s.name: raw(s) for s in slices}
        self.version += 1

    async def changed(self) -> None:  # not used: the tests take snapshots themselves
        raise NotImplementedError

    def statuses(self) -> dict[str, QueryStatus]:
        return dict(self.unknown)

    def update(self, target: object, deltas: Any = None) -> bool:
        if self._taken == self.version:
            return False
        self._taken = self.version
        target.resourceslices = dict(self.slices)  # type: ignore[attr-defined]
        node = {"metadata": {"name": NODE, "uid": self.node_uid}}
        target.node = (  # type: ignore[attr-defined]
            {("", NODE): msgspec.json.encode(node)} if self.node_uid is not None else {}
        )
        return True


def slices(names: list[str], rv: str) -> st.SearchStrategy[list[Slice]]:
    return st.tuples(
        *(
            st.builds(Slice, st.just(n), st.sampled_from(ALL_POOLS), st.booleans(), st.just(rv))
            for n in names
        )
    ).map(list)


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[list[Slice], list[Slice]]:
    """Two snapshots in a row. A resourceVersion names one content of an object: a slice
    seen again with the same one is the same (the grouping relies on it)."""
    names = draw(st.lists(st.sampled_from([f"s{i}" for i in range(8)]), unique=True, max_size=8))
    before = draw(slices(names, "1"))
    after: list[Slice] = []
    for s in before:
        fate = draw(st.sampled_from(["kept", "changed", "gone"]))
        if fate == "kept":
            after.append(s)
        elif fate == "changed":
            after.append(draw(slices([s.name], "2"))[0])
    new = draw(st.lists(st.sampled_from([f"n{i}" for i in range(4)]), unique=True, max_size=4))
    return before, after + draw(slices(new, "1"))


def model_groups(slices: list[Slice]) -> dict[PoolKey, dict[str, str]]:
    out: dict[PoolKey, dict[str, str]] = {}
    for s in slices:
        if s.ours:
            out.setdefault(s.key, {})[s.name] = s.rv
    return out


def model_foreign(slices: list[Slice]) -> dict[PoolKey, tuple[str, ...]]:
    out: dict[PoolKey, list[str]] = {}
    for s in slices:
        if not s.ours:
            out.setdefault(s.key, []).append(s.name)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def shown(observed: ObservedSlices) -> dict[PoolKey, dict[str, str]]:
    return {k: observed.versions(k) for k in observed.groups}


@settings(max_examples=200, deadline=None)
@given(pair=snapshots(), desired=st.sets(st.sampled_from(ALL_POOLS), max_size=4))
def test_grouping_and_the_pools_a_snapshot_changes(
    pair: tuple[list[Slice], list[Slice]], desired: set[PoolKey]
) -> None:
    before, after = pair
    source = Source()
    observed = ObservedSlices(source, NODE)
    source.show(before)
    assert observed.take()
    observed.regroup(desired)
    assert shown(observed) == model_groups(before)
    assert observed.foreign == model_foreign(before)

    source.show(after)
    assert observed.take()
    changed = observed.regroup(desired)
    groups, foreign = model_groups(after), model_foreign(after)
    assert shown(observed) == groups
    assert observed.foreign == foreign
    for key, group in observed.groups.items():
        assert all(s.key == key and s.ours for s in group.values())
    # Our slices' pools change when their {name: resourceVersion} does; foreign slices matter
    # only beside pools we publish or want to publish.
    old_groups, old_foreign = model_groups(before), model_foreign(before)
    ours = desired | set(groups) | set(old_groups)
    expected = {k for k in ALL_POOLS if groups.get(k, {}) != old_groups.get(k, {})} | {
        k for k in ours if foreign.get(k) != old_foreign.get(k)
    }
    assert changed == expected


def test_a_slice_is_prepared_once_per_resource_version() -> None:
    source = Source()
    observed = ObservedSlices(source, NODE)
    a = Slice("a", ALL_POOLS[0], True, "1")
    source.show([a])
    observed.take()
    observed.regroup(())
    seen = observed.groups[a.key]["a"]
    source.show([a, Slice("b", ALL_POOLS[1], True, "1")])
    observed.take()
    assert observed.regroup(()) == {ALL_POOLS[1]}
    assert observed.groups[a.key]["a"] is seen
    source.show([Slice("a", ALL_POOLS[0], True, "2")])
    observed.take()
    assert observed.regroup(()) == {ALL_POOLS[0], ALL_POOLS[1]}
    assert observed.groups[a.key]["a"] is not seen
    assert seen.node_owners == frozenset({"node-uid-1"})


def test_an_undecodable_slice_is_left_out_and_the_rest_grouped() -> None:
    source = Source()
    observed = ObservedSlices(source, NODE)
    source.show([Slice("a", ALL_POOLS[0], True, "1")])
    source.slices["bad"] = b"{not json"
    observed.take()
    assert observed.regroup(()) == {ALL_POOLS[0]}
    assert list(observed.groups[ALL_POOLS[0]]) == ["a"]


def test_refresh_leaves_out_the_synced_pool_changed_only_by_its_own_writes() -> None:
    source = Source()
    observed = ObservedSlices(source, NODE)
    key = ALL_POOLS[0]
    source.show([Slice("a", key, True, "1")])
    assert observed.refresh([key]) == {key}  # the Node turned up: every pool
    assert observed.refresh([key]) is None  # no new snapshot
    # The sync's own write: nothing to do again.
    source.show([Slice("a", key, True, "2")])
    assert observed.refresh([key], key, {"a": "2"}) == set()
    # Someone else's write to our slice: the pool runs again.
    source.show([Slice("a", key, True, "3")])
    assert observed.refresh([key], key, {"a": "2"}) == {key}
    # Our write and a foreign slice in the same snapshot: never taken for our own.
    source.show([Slice("a", key, True, "4"), Slice("x", key, False, "1")])
    assert observed.refresh([key], key, {"a": "4"}) == {key}


def test_refresh_queues_every_pool_when_the_node_is_recreated() -> None:
    source = Source()
    observed = ObservedSlices(source, NODE)
    ours, wanted = ALL_POOLS[0], ALL_POOLS[1]
    source.node_uid = None
    source.show([Slice("a", ours, True, "1")])
    assert observed.refresh([wanted]) == {ours}
    assert observed.node_uid is None
    assert observed.blocked() == f"waiting for Node {NODE}"
    source.node_uid = "node-uid-2"
    source.version += 1
    assert observed.refresh([wanted]) == {ours, wanted}
    assert observed.node_uid == "node-uid-2"
    assert observed.blocked() is None


def test_blocked_names_the_queries_whose_state_is_not_known() -> None:
    source = Source()
    observed = ObservedSlices(source, NODE)
    source.show([])
    observed.refresh([])
    source.unknown = {
        "resourceslices": QueryStatus("resourceslices", QueryState.FORBIDDEN, reason="403")
    }
    assert observed.blocked() == "the observed state is not known (resourceslices: 403)"
