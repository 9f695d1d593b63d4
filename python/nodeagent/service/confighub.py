"""The running configuration and its hot apply: one `ConfigHub` per process.

Each table of the config has one typed handle on the hub (`hub.plugins`: a `Table` of
`PluginSettings`): components read it at the point of use (`hub.plugins.value.scan_interval`),
so the next loop takes a new value without a restart, and subscribe to it for a veto or a
notice. A proposal (SIGHUP's re-read file, a remote config) is all or nothing: a changed field
outside the dynamic set, or one veto from a subscriber, discards the whole change and the
running config stays. Vetoes are checked before anything is swapped, so no component ever sees
half a change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from nodeagent.core.latest import LatestValue

# The one list of fields a running agent takes without a restart (each read at its point of
# use); everything else is static: a change to it is refused with the field named.
from nodeagent.dynconfig.overlay import DYNAMIC_FIELDS
from nodeagent.log import get_logger
from nodeagent.service.config import Config

log = get_logger(__name__)

__all__ = ["DYNAMIC_FIELDS", "ApplyResult", "ConfigHub", "Table", "changed_fields"]

T = TypeVar("T")
# (old table, new table) -> a veto reason, or None to accept.
VetoHook = Callable[[T, T], "str | None"]
# (old table, new table), called once the change is committed (e.g. the log module's level).
AppliedHook = Callable[[T, T], None]


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
class _Subscriber(Generic[T]):
    name: str
    on_change: VetoHook[T] | None
    on_applied: AppliedHook[T] | None


class Table(LatestValue[T]):
    """One table of the running config: its live value (a `LatestValue`, bumped only when a
    field of this table changes) and the components subscribed to its changes."""

    def __init__(self, name: str, value: T) -> None:
        super().__init__(value)
        self.name = name
        self._subscribers: list[_Subscriber[T]] = []

    def subscribe(
        self,
        on_change: VetoHook[T] | None = None,
        *,
        on_applied: AppliedHook[T] | None = None,
        name: str = "",
    ) -> Table[T]:
        """`on_change` may veto a change of this table (a reason, or None to accept);
        `on_applied` is told once it is committed. `name` says who vetoed."""
        self._subscribers.append(_Subscriber(name or self.name, on_change, on_applied))
        return self

    def vetoes(self, old: T, new: T) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for sub in self._subscribers:
            if sub.on_change is None:
                continue
            try:
                reason = sub.on_change(old, new)
            except Exception as exc:  # a broken hook refuses, it does not crash the apply
                reason = f"veto hook failed: {exc}"
            if reason:
                out.append((sub.name, reason))
        return out

    def commit(self, old: T, new: T) -> None:
        self.set(new)
        for sub in self._subscribers:
            if sub.on_applied is None:
                continue
            try:
                sub.on_applied(old, new)
            except Exception as exc:
                log.exception("config applied hook failed", subscriber=sub.name, error=str(exc))


class ConfigHub:
    """Holds the active `Config` and one `Table` per table of it."""

    def __init__(self, config: Config, dynamic: frozenset[str] = DYNAMIC_FIELDS) -> None:
        self._current = config
        self._dynamic = dynamic
        self.agent = Table("agent", config.agent)
        self.ops = Table("ops", config.ops)
        self.plugins = Table("plugins", config.plugins)
        self.kube = Table("kube", config.kube)
        self.accumulator = Table("accumulator", config.accumulator)
        self.resources = Table("resources", config.resources)
        self.reporter = Table("reporter", config.reporter)
        self.dynconfig = Table("dynconfig", config.dynconfig)
        # By name for the proposals' dotted paths (a Config table without a handle fails here).
        self._tables: dict[str, Table[Any]] = {
            f.name: getattr(self, f.name) for f in msgspec.structs.fields(Config)
        }

    @property
    def current(self) -> Config:
        return self._current

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
            for table in sorted({path.split(".", 1)[0] for path in changed}):
                vetoes += self._tables[table].vetoes(getattr(old, table), getattr(new, table))
        if vetoes:
            result = ApplyResult(applied=False, changed=changed, vetoes=vetoes)
            log.warning("config change refused", source=source, reason=result.reason())
            return result
        self._current = new
        for table in dict.fromkeys(path.split(".", 1)[0] for path in changed):
            self._tables[table].commit(getattr(old, table), getattr(new, table))
        log.info("config change applied", source=source, changed=",".join(changed))
        return ApplyResult(applied=True, changed=changed)
