"""The public value types of the accumulator: queries, keys, snapshot views and deltas."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar, cast

from nodeagent._native import PMap
from nodeagent.accumulator.selectors import FieldSelector, LabelSelector
from nodeagent.kube import Resource

T = TypeVar("T")


class ObjectKey(NamedTuple):
    """Namespace ("" for cluster-scoped objects) and name: the identity of an object in a
    query. Tuples sort by (namespace, name), the snapshot order."""

    namespace: str
    name: str


class DeltaType(enum.StrEnum):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"


_DELTA_TYPES = (DeltaType.ADD, DeltaType.UPDATE, DeltaType.DELETE)


@dataclass(frozen=True, slots=True)
class Delta(Generic[T]):
    """One object's coalesced change since the previous `update()`. An object deleted and
    re-created under the same name (another uid) is never an update: it comes as a delete of
    the object last shown immediately followed by an add of the new one."""

    query: str
    type: DeltaType
    key: ObjectKey
    resource_version: str
    # The new object for add/update; the last one shown for delete.
    obj: T


class QueryState(enum.StrEnum):
    """Whether a query's snapshot reflects the cluster."""

    # The first list has not completed (or the kind is not resolved yet): nothing is known.
    SYNCING = "syncing"
    # Listed, and the watch follows the cluster.
    SYNCED = "synced"
    # A relist (after a 410 or a Forbidden watch) is under way: the last consistent snapshot is
    # served, and it may be stale. A relist that failed is reported in readiness.
    RELISTING = "relisting"
    # The list is Forbidden: the query is served as empty, what exists is unknown.
    FORBIDDEN = "forbidden"


@dataclass(frozen=True, slots=True)
class QueryStatus:
    """One query's state, and why it is not `SYNCED` (None when it is)."""

    query: str
    state: QueryState
    reason: str | None = None

    @property
    def known(self) -> bool:
        """The snapshot shows what exists: safe to act on absences (e.g. to create what is
        missing). Only a synced query is."""
        return self.state is QueryState.SYNCED


@dataclass(frozen=True)  # no slots: Query[T](...) must be able to set __orig_class__
class Query(Generic[T]):
    """What to watch, and how to present it.

    ``kind`` is a kind name resolved through discovery in ``api_version`` (CRDs too), or a
    `Resource`. ``into`` is the type objects are decoded into with msgspec (a Struct); None
    keeps the raw JSON bytes. ``predicate`` filters objects when they are added or changed.
    """

    name: str
    api_version: str
    kind: str | Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    predicate: Callable[[T], bool] | None = None
    into: type[T] | None = None
    labels: LabelSelector = field(init=False, repr=False, compare=False)
    fields: FieldSelector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"query name {self.name!r}: must be a Python identifier")
        if not self.api_version:
            raise ValueError(f"query {self.name}: api_version must not be empty")
        if isinstance(self.kind, str) and not self.kind:
            raise ValueError(f"query {self.name}: kind must not be empty")
        if isinstance(self.kind, Resource) and self.kind.api_version != self.api_version:
            raise ValueError(
                f"query {self.name}: resource {self.kind.plural} is {self.kind.api_version}, "
                f"not {self.api_version}"
            )
        object.__setattr__(self, "labels", LabelSelector(self.label_selector or ""))
        object.__setattr__(self, "fields", FieldSelector(self.field_selector or ""))


class ObjectMap(Mapping[ObjectKey, T]):
    """An immutable snapshot of one query: objects keyed by `ObjectKey`, iterated in
    (namespace, name) order. Successive snapshots share storage (a persistent B-tree in Rust),
    so producing the next one costs in proportion to the changes, not to the size."""

    __slots__ = ("_m",)

    def __init__(self, pmap: PMap | None = None) -> None:
        self._m = pmap if pmap is not None else PMap()

    def __getitem__(self, key: ObjectKey) -> T:
        obj = self._m.get(key[0], key[1])
        if obj is None:
            raise KeyError(key)
        return cast(T, obj)

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(cast(list[ObjectKey], self._m.keys()))

    def __len__(self) -> int:
        return len(self._m)

    def __contains__(self, key: object) -> bool:
        return (
            isinstance(key, tuple)
            and len(key) == 2
            and isinstance(key[0], str)
            and isinstance(key[1], str)
            and self._m.contains(key[0], key[1])
        )

    def __repr__(self) -> str:
        return f"ObjectMap({len(self)} objects)"

    def items_list(self) -> list[tuple[ObjectKey, T]]:
        return cast(list[tuple[ObjectKey, T]], self._m.items())

    def values_list(self) -> list[T]:
        return cast(list[T], self._m.values())

    def lookup(self, namespace: str, name: str) -> T | None:
        return cast(T | None, self._m.get(namespace, name))

    def updated(self, changes: list[tuple[str, str, ObjectKey, T | None]]) -> ObjectMap[T]:
        """A new map with ``changes`` applied ((namespace, name, key, object or None to
        remove)); this one is unchanged."""
        return ObjectMap(self._m.updated(cast(list[tuple[str, str, object, object]], changes)))


def delta_type(code: int) -> DeltaType:
    return _DELTA_TYPES[code]
