"""The public value types of the accumulator: queries, keys, snapshot views and deltas."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from nodeagent.accumulator.selectors import FieldSelector, LabelSelector
from nodeagent.kube.resource import Resource

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
    """One object's coalesced change since the previous `update()`."""

    query: str
    type: DeltaType
    key: ObjectKey
    resource_version: str
    # The new object for add/update; the last one shown for delete.
    obj: T


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
    (namespace, name) order. A new map is built only for a query that changed."""

    __slots__ = ("_objs", "_order")

    def __init__(
        self, objs: dict[ObjectKey, T] | None = None, order: list[ObjectKey] | None = None
    ) -> None:
        self._objs: dict[ObjectKey, T] = objs if objs is not None else {}
        self._order: list[ObjectKey] = order if order is not None else sorted(self._objs)

    def __getitem__(self, key: ObjectKey) -> T:
        return self._objs[key]

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._objs)

    def __contains__(self, key: object) -> bool:
        return key in self._objs

    def __repr__(self) -> str:
        return f"ObjectMap({len(self)} objects)"

    def items_list(self) -> list[tuple[ObjectKey, T]]:
        objs = self._objs
        return [(k, objs[k]) for k in self._order]

    def values_list(self) -> list[T]:
        objs = self._objs
        return [objs[k] for k in self._order]

    def lookup(self, namespace: str, name: str) -> T | None:
        return self._objs.get(ObjectKey(namespace, name))


def delta_type(code: int) -> DeltaType:
    return _DELTA_TYPES[code]


def any_map() -> ObjectMap[Any]:
    return ObjectMap()
