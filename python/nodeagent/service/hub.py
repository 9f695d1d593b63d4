"""The running configuration and its hot apply: one `ConfigHub` per process.

Components read their table through a `LatestValue` (`hub.table(name)`) at the point of use, so
the next loop takes a new value without a restart. A proposal (SIGHUP's re-read file, a remote
config) is all or nothing: a changed field outside the dynamic set, or one veto from a
subscriber, discards the whole change and the running config stays. Vetoes are checked before
anything is swapped, so no component ever sees half a change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nodeagent.core.latest import LatestValue

# The one list of fields a running agent takes without a restart (each read at its point of
# use); everything else is static: a change to it is refused with the field named.
from nodeagent.dynconfig.overlay import DYNAMIC_FIELDS
from nodeagent.log import get_logger
from nodeagent.service.config import Config

log = get_logger(__name__)

__all__ = ["DYNAMIC_FIELDS", "ApplyResult", "ConfigHub", "changed_fields"]

# (old table, new table) -> a veto reason, or None to accept.
VetoHook = Callable[[Any, Any], "str | None"]
# (old table, new table), called once the change is committed (e.g. the log module's level).
AppliedHook = Callable[[Any, Any], None]


@dataclass(slots=True)
class ApplyResult:
    applied: bool
    changed: list[str] = field(default_factory=list)
    # (who, why): a component's veto, or "static" for a field that needs a restart.
    vetoes: list[tuple[str, str]] = field(default_factory=list)

    def reason(self) -> str:
        return "; ".join(f"{who}: {why}" for who, why in self.vetoes)


def changed_fields(old: Config, new: Config) -> list[str]:
    """Dotted `table.field` paths whose values differ (compared as plain data)."""
    out: list[str] = []
    for table in msgspec.structs.fields(Config):
        before, after = getattr(old, table.name), getattr(new, table.name)
        if before == after:
            continue
        for f in msgspec.structs.fields(type(before)):
            if msgspec.to_builtins(getattr(before, f.name)) != msgspec.to_builtins(
                getattr(after, f.name)
            ):
                out.append(f"{table.name}.{f.name}")
    return out


@dataclass(slots=True)
class _Subscriber:
    name: str
    on_change: VetoHook | None
    on_applied: AppliedHook | None


class ConfigHub:
    """Holds the active `Config`, one `LatestValue` per table, and the subscribers' hooks."""

    def __init__(self, config: Config, dynamic: frozenset[str] = DYNAMIC_FIELDS) -> None:
        self._current = config
        self._dynamic = dynamic
        self._tables: dict[str, LatestValue[Any]] = {
            f.name: LatestValue(getattr(config, f.name)) for f in msgspec.structs.fields(Config)
        }
        self._subscribers: dict[str, list[_Subscriber]] = {}

    @property
    def current(self) -> Config:
        return self._current

    def table(self, name: str) -> LatestValue[Any]:
        """The live value of one table (`hub.table("plugins").value.scan_interval`)."""
        return self._tables[name]

    def subscribe(
        self,
        table: str,
        on_change: VetoHook | None = None,
        *,
        on_applied: AppliedHook | None = None,
        name: str = "",
    ) -> LatestValue[Any]:
        if table not in self._tables:
            raise KeyError(f"no config table {table!r}")
        subscriber = _Subscriber(name or table, on_change, on_applied)
        self._subscribers.setdefault(table, []).append(subscriber)
        return self._tables[table]

    def propose(self, new: Config, source: str) -> ApplyResult:
        """Apply `new` as a whole, or nothing of it (static field changed, or a veto)."""
        old = self._current
        changed = changed_fields(old, new)
        if not changed:
            return ApplyResult(applied=True)
        vetoes = [
            ("static", f"{path} is static: restart the agent to change it")
            for path in changed
            if path not in self._dynamic
        ]
        if not vetoes:
            vetoes = self._ask(old, new, {path.split(".", 1)[0] for path in changed})
        if vetoes:
            result = ApplyResult(applied=False, changed=changed, vetoes=vetoes)
            log.warning("config change refused", source=source, reason=result.reason())
            return result
        self._commit(old, new, changed)
        log.info("config change applied", source=source, changed=",".join(changed))
        return ApplyResult(applied=True, changed=changed)

    def _ask(self, old: Config, new: Config, tables: set[str]) -> list[tuple[str, str]]:
        vetoes: list[tuple[str, str]] = []
        for table in sorted(tables):
            for sub in self._subscribers.get(table, []):
                if sub.on_change is None:
                    continue
                try:
                    reason = sub.on_change(getattr(old, table), getattr(new, table))
                except Exception as exc:  # a broken hook refuses, it does not crash the apply
                    reason = f"veto hook failed: {exc}"
                if reason:
                    vetoes.append((sub.name, reason))
        return vetoes

    def _commit(self, old: Config, new: Config, changed: list[str]) -> None:
        self._current = new
        for table in dict.fromkeys(path.split(".", 1)[0] for path in changed):
            self._tables[table].set(getattr(new, table))
            for sub in self._subscribers.get(table, []):
                if sub.on_applied is None:
                    continue
                try:
                    sub.on_applied(getattr(old, table), getattr(new, table))
                except Exception as exc:
                    log.exception("config applied hook failed", subscriber=sub.name, error=str(exc))
