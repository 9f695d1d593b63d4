"""One query's side of `update()`: drain the store, decode only what changed, and build the
next immutable `ObjectMap` copy-on-write from the previous one."""

from __future__ import annotations

import bisect
from typing import Any

import msgspec

from nodeagent._native import Store
from nodeagent.accumulator import metrics
from nodeagent.accumulator.model import Delta, DeltaType, ObjectKey, ObjectMap, Query, delta_type
from nodeagent.log import get_logger

log = get_logger(__name__)

# Above this many inserted keys a merge-sort of the key list beats repeated bisect inserts.
_BULK_INSERT = 32


class QueryView:
    def __init__(self, query: Query[Any]) -> None:
        self.query = query
        self.store = Store()
        self.view: ObjectMap[Any] = ObjectMap()
        self._decoder: msgspec.json.Decoder[Any] | None = (
            msgspec.json.Decoder(query.into) if query.into is not None else None
        )
        self._decoded: dict[ObjectKey, Any] = {}
        self._needs_accept = query.into is not None or query.predicate is not None

    def _accept(self, namespace: str, name: str, raw: bytes) -> bool | None:
        """The store's question for each added or changed object: show it (True), exclude it
        (False) or keep the last good version (None, when it cannot be decoded or judged)."""
        q = self.query
        obj: Any = raw
        if self._decoder is not None:
            try:
                obj = self._decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                metrics.MALFORMED.labels(q.name, "decode").inc()
                log.warning(
                    "object does not decode: keeping the last good version",
                    query=q.name,
                    namespace=namespace,
                    name=name,
                    error=str(exc),
                )
                return None
        if q.predicate is not None:
            try:
                ok = bool(q.predicate(obj))
            except Exception as exc:
                metrics.MALFORMED.labels(q.name, "predicate").inc()
                log.warning(
                    "predicate raised: keeping the last good version",
                    query=q.name,
                    namespace=namespace,
                    name=name,
                    error=repr(exc),
                )
                return None
            if not ok:
                return False
        self._decoded[ObjectKey(namespace, name)] = obj
        return True

    def drain(self) -> list[Delta[Any]]:
        """Applies the store's coalesced changes to the view; returns them as deltas."""
        self._decoded.clear()
        try:
            raw_deltas = self.store.drain(self._accept if self._needs_accept else None)
        finally:
            decoded, self._decoded = self._decoded, {}
        if not raw_deltas:
            return []
        old = self.view
        objs = dict(old._objs)
        added: list[ObjectKey] = []
        removed: set[ObjectKey] = set()
        deltas: list[Delta[Any]] = []
        name = self.query.name
        for code, ns, n, rv, raw in raw_deltas:
            key = ObjectKey(ns, n)
            kind = delta_type(code)
            if kind is DeltaType.DELETE:
                obj = objs.pop(key)
                removed.add(key)
            else:
                obj = decoded[key] if self._needs_accept else raw
                if kind is DeltaType.ADD:
                    added.append(key)
                objs[key] = obj
            deltas.append(Delta(name, kind, key, rv, obj))
            metrics.DELTAS.labels(name, kind.value).inc()
        order = old._order
        if added or removed:
            order = self._reorder(order, added, removed)
        self.view = ObjectMap(objs, order)
        metrics.OBJECTS.labels(name).set(len(objs))
        deltas.sort(key=lambda d: d.key)
        return deltas

    @staticmethod
    def _reorder(
        order: list[ObjectKey], added: list[ObjectKey], removed: set[ObjectKey]
    ) -> list[ObjectKey]:
        # An add after a delete of the same key in one drain cannot happen (the store coalesces
        # it into an update), so added and removed are disjoint.
        if len(added) + len(removed) > _BULK_INSERT:
            kept = [k for k in order if k not in removed] if removed else list(order)
            kept.extend(added)
            kept.sort()  # two sorted runs: timsort merges them in linear time
            return kept
        new = list(order)
        for k in removed:
            del new[bisect.bisect_left(new, k)]
        for k in added:
            bisect.insort(new, k)
        return new
