"""A plain Python reference of the store's rules (json.loads + dicts), for property tests and
as the benchmark baseline. Same interface as `nodeagent._native.Store`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _is_num(rv: str) -> bool:
    return rv.isdigit() and rv.isascii() and (rv == "0" or not rv.startswith("0"))


def supersedes(watch: str, local: str) -> bool:
    """A watch object at ``watch`` replaces a local override at ``local``."""
    if _is_num(watch) and _is_num(local):
        return int(watch) >= int(local)
    return True


def newer_than_local(new: str, held: str) -> bool:
    if _is_num(new) and _is_num(held):
        return int(new) > int(held)
    return new != held


def newer_than(a: str, b: str) -> bool:
    if _is_num(a) and _is_num(b):
        return int(a) > int(b)
    return True


@dataclass
class Obj:
    uid: str
    rv: str
    raw: bytes


@dataclass
class Local:
    obj: Obj | None  # None: tombstone
    deadline: float
    tomb_uid: str = ""
    tomb_rv: str = ""


@dataclass
class Entry:
    watch: Obj | None = None
    local: Local | None = None
    # ("visible", rv, uid) or ("excluded", rv, ""): what the consumer saw at the last drain
    shown: tuple[str, str, str] | None = None
    dirty: bool = False
    seen: int = 0

    def effective(self) -> Obj | None:
        if self.local is not None:
            return self.local.obj
        return self.watch

    def eff_rv(self) -> str | None:
        e = self.effective()
        return None if e is None else e.rv

    def dead(self) -> bool:
        return self.watch is None and self.local is None and self.shown is None and not self.dirty


class Malformed(ValueError):
    pass


def _head(obj: Any) -> tuple[str, Obj]:
    if not isinstance(obj, dict):
        raise Malformed("not an object")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name, rv = meta.get("name"), meta.get("resourceVersion")
    if not name:
        raise Malformed("object has no metadata.name")
    if not rv:
        raise Malformed("no resourceVersion")
    ns = meta.get("namespace") or ""
    if "/" in name or "/" in ns:
        raise Malformed("slash")
    return f"{ns}/{name}", Obj(meta.get("uid") or "", rv, b"")


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class RefStore:
    def __init__(self) -> None:
        self.map: dict[str, Entry] = {}
        self.dirty: list[str] = []
        self.partial = b""
        self.generation = 0
        self.poisoned = False

    # -- mutation helpers

    def _entry(self, key: str) -> Entry:
        return self.map.setdefault(key, Entry())

    def _mark(self, key: str, before: str | None) -> None:
        e = self.map[key]
        if e.eff_rv() == before:
            if e.dead():
                del self.map[key]
            return
        if not e.dirty:
            e.dirty = True
            self.dirty.append(key)

    def watch_upsert(self, key: str, obj: Obj) -> None:
        e = self._entry(key)
        e.seen = self.generation
        if e.watch is not None and e.watch.rv == obj.rv:
            return
        before = e.eff_rv()
        drop = False
        if e.local is not None:
            if e.local.obj is not None:
                drop = supersedes(obj.rv, e.local.obj.rv)
            else:
                drop = e.local.tomb_uid != obj.uid and newer_than(obj.rv, e.local.tomb_rv)
        e.watch = obj
        if drop:
            e.local = None
        self._mark(key, before)

    def watch_delete(self, key: str, rv: str) -> None:
        e = self.map.get(key)
        if e is None:
            return
        before = e.eff_rv()
        drop = False
        if e.local is not None:
            drop = e.local.obj is None or supersedes(rv, e.local.obj.rv)
        e.watch = None
        if drop:
            e.local = None
        self._mark(key, before)

    # -- the Store interface

    def feed(self, chunk: bytes) -> tuple[str | None, tuple[int, str, str] | None, int, list[str]]:
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        rv: str | None = None
        events = 0
        malformed: list[str] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                if not isinstance(ev, dict):
                    raise Malformed("event is not an object")
                ty, obj = ev.get("type"), ev.get("object")
                if not isinstance(ty, str):
                    raise Malformed("no type")
                if not isinstance(obj, dict):
                    raise Malformed("no object")
                if ty in ("ADDED", "MODIFIED"):
                    key, o = _head(obj)
                    o.raw = _dump(obj)
                    self.watch_upsert(key, o)
                    rv = o.rv
                elif ty == "DELETED":
                    key, o = _head(obj)
                    self.watch_delete(key, o.rv)
                    rv = o.rv
                elif ty == "BOOKMARK":
                    brv = (obj.get("metadata") or {}).get("resourceVersion")
                    if brv:
                        rv = brv
                elif ty == "ERROR":
                    self.partial = b""
                    err = (obj.get("code", 0), obj.get("reason", ""), obj.get("message", ""))
                    return rv, err, events, malformed
                else:
                    raise Malformed(f"unknown type {ty}")
                events += 1
            except (ValueError, AttributeError) as exc:
                malformed.append(str(exc))
        return rv, None, events, malformed

    def end_stream(self) -> None:
        self.partial = b""

    def begin_list(self) -> None:
        self.generation += 1
        self.poisoned = False

    def list_page(self, page: bytes) -> tuple[int, list[str]]:
        try:
            body = json.loads(page)
        except ValueError as exc:
            self.poisoned = True
            raise ValueError(str(exc)) from exc
        kind = body.get("kind") or ""
        kind = kind.removesuffix("List")
        api = body.get("apiVersion") or ""
        n, bad = 0, []
        for item in body.get("items") or []:
            try:
                key, o = _head(item)
            except Malformed as exc:
                self.poisoned = True
                bad.append(str(exc))
                continue
            full = {}
            if "kind" not in item and kind:
                full["kind"] = kind
            if "apiVersion" not in item and api:
                full["apiVersion"] = api
            full.update(item)
            o.raw = _dump(full)
            self.watch_upsert(key, o)
            n += 1
        return n, bad

    def end_list(self, resource_version: str) -> int:
        if self.poisoned:
            return 0
        gone = [k for k, e in self.map.items() if e.watch is not None and e.seen != self.generation]
        for k in gone:
            self.watch_delete(k, resource_version)
        return len(gone)

    def apply_local(self, obj: bytes, deadline: float) -> bool:
        doc = json.loads(obj)
        key, o = _head(doc)
        o.raw = obj
        e = self._entry(key)
        stale = (e.watch is not None and not newer_than_local(o.rv, e.watch.rv)) or (
            e.local is not None
            and e.local.obj is not None
            and not newer_than_local(o.rv, e.local.obj.rv)
        )
        if stale:
            if e.dead():
                del self.map[key]
            return False
        before = e.eff_rv()
        e.local = Local(o, deadline)
        self._mark(key, before)
        return True

    def delete_local(self, namespace: str, name: str, deadline: float) -> bool:
        key = f"{namespace}/{name}"
        e = self.map.get(key)
        if e is None or e.effective() is None:
            return False
        cur = e.effective()
        assert cur is not None
        before = e.eff_rv()
        e.local = Local(None, deadline, cur.uid, cur.rv)
        self._mark(key, before)
        return True

    def expire(self, now: float) -> int:
        n = 0
        for key in sorted(k for k, e in self.map.items() if e.local and e.local.deadline <= now):
            e = self.map[key]
            before = e.eff_rv()
            e.local = None
            self._mark(key, before)
            n += 1
        return n

    def pending(self) -> int:
        return len(self.dirty)

    def drain(
        self, accept: Callable[[str, str, bytes], bool | None] | None = None
    ) -> list[tuple[int, str, str, str, bytes | None]]:
        verdicts: dict[str, bool | None] = {}
        if accept is not None:
            for key in self.dirty:
                e = self.map[key]
                o = e.effective()
                if o is None or (e.shown is not None and e.shown[1] == o.rv):
                    continue
                ns, _, name = key.partition("/")
                verdicts[key] = accept(ns, name, o.raw)
        out: list[tuple[int, str, str, str, bytes | None]] = []
        dirty, self.dirty = self.dirty, []
        for key in dirty:
            e = self.map[key]
            e.dirty = False
            o = e.effective()
            nxt: tuple[str, str, str] | None
            if o is None:
                nxt = None
            elif e.shown is not None and e.shown[1] == o.rv:
                nxt = e.shown
            else:
                v = verdicts.get(key, True)
                if v is True:
                    nxt = ("visible", o.rv, o.uid)
                elif v is False:
                    nxt = ("excluded", o.rv, "")
                else:
                    nxt = e.shown
            ns, _, name = key.partition("/")
            was, now = e.shown, nxt
            if was is not None and was[0] == "visible":
                if now is None or now[0] == "excluded":
                    out.append((2, ns, name, was[1], None))
                elif now[1] != was[1]:
                    assert o is not None
                    if was[2] and now[2] and was[2] != now[2]:  # deleted and re-created
                        out.append((2, ns, name, was[1], None))
                        out.append((0, ns, name, now[1], o.raw))
                    else:
                        out.append((1, ns, name, now[1], o.raw))
            elif now is not None and now[0] == "visible":
                assert o is not None
                out.append((0, ns, name, now[1], o.raw))
            e.shown = nxt
            if e.dead():
                del self.map[key]
        return out

    def get(self, namespace: str, name: str) -> bytes | None:
        e = self.map.get(f"{namespace}/{name}")
        o = e.effective() if e else None
        return o.raw if o else None

    def shown_keys(self) -> list[tuple[str, str]]:
        out = []
        for k, e in self.map.items():
            if e.shown is not None and e.shown[0] == "visible":
                ns, _, name = k.partition("/")
                out.append((ns, name))
        return out

    def __len__(self) -> int:
        return sum(1 for e in self.map.values() if e.effective() is not None)
