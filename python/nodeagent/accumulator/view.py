"""One query's side of `update()`: drain the store, decode only what changed, and derive the
next immutable `ObjectMap` from the previous one (sharing everything unchanged)."""

from __future__ import annotations

from typing import Any

import msgspec

from nodeagent._native import Store
from nodeagent.accumulator import metrics
from nodeagent.accumulator.model import Delta, DeltaType, ObjectKey, ObjectMap, Query, delta_type
from nodeagent.log import get_logger

log = get_logger(__name__)


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
        changes: list[tuple[str, str, ObjectKey, Any]] = []
        deltas: list[Delta[Any]] = []
        name = self.query.name
        for code, ns, n, rv, raw in raw_deltas:
            key = ObjectKey(ns, n)
            kind = delta_type(code)
            if kind is DeltaType.DELETE:
                obj = old.lookup(ns, n)
                changes.append((ns, n, key, None))
            else:
                obj = decoded[key] if self._needs_accept else raw
                changes.append((ns, n, key, obj))
            deltas.append(Delta(name, kind, key, rv, obj))
            metrics.DELTAS.labels(name, kind.value).inc()
        self.view = old.updated(changes)
        metrics.OBJECTS.labels(name).set(len(self.view))
        deltas.sort(key=lambda d: d.key)
        return deltas
