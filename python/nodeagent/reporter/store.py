"""The report store: every reporter plugin's last report, its lifecycle, and its checkpoint.

Katalyst's ReporterPluginManager keeps an endpoint per plugin with a cache of its last report;
this is that cache, with the lifecycle made explicit:

- a plugin's report is replaced by every message it delivers (stream or poll, through the plugin
  manager's `ReporterPlugin` channel) and by every collection of an in-tree reporter;
- a plugin that deregisters, or stops delivering (`PluginData.live` false: its stream ended and
  its polls fail), or vanishes from the channel, keeps its report as a stopped entry for
  `reporter.grace`, then it is dropped; delivering again (a re-registration) makes it running
  with the report carried over until a new one arrives;
- every change is checkpointed (`reporter_manager_checkpoint`, in-tree reporters included, as
  newer Katalyst does); on start, checkpointed plugins come back as stopped entries with their
  report until they deliver again or the grace runs out. An unreadable checkpoint is a fresh
  start (the checkpoint store moves a corrupt file aside; a valid file whose content does not
  parse is logged and counted here).

The store publishes `latest`, a `LatestValue[Mapping[str, PluginReport]]` keyed by plugin name:
a plugin whose grace ran out is absent.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import trio

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.core.wake import Deadlines, Wake
from nodeagent.log import get_logger
from nodeagent.reporter import metrics
from nodeagent.reporter.model import PluginReport, Report, parse_report
from nodeagent.reporter.settings import ReporterSettings

__all__ = ["CHECKPOINT_NAME", "InTreeReporter", "ReportStore"]

log = get_logger(__name__)

T = TypeVar("T")

CHECKPOINT_NAME = "reporter_manager_checkpoint"  # Katalyst's name (a different format: ours)
_CHECKPOINT_VERSION = 1
# Seconds the last checkpoint write may take when the store stops with changes not on disk.
FLUSH_TIMEOUT = 5.0


class InTreeReporter(Protocol):
    """A reporter inside the agent (the system reporter): collected every `sync_interval`."""

    name: str

    def collect(self) -> Report:
        """The current report; synchronous (it reads files), run in a worker thread. Raises on
        failure (the last report is kept)."""
        ...


class RunSync(Protocol):
    """How blocking work (checkpoint I/O, in-tree collection) is run: a worker thread."""

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T: ...


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(fn, *args)


@dataclass
class _Entry:
    response: Report
    running: bool
    stopped_at: float | None  # wall clock, for the published PluginReport

    def report(self, name: str) -> PluginReport:
        return PluginReport(name, self.response, self.running, self.stopped_at)


class ReportStore:
    """Keeps each reporter plugin's last report; see the module docstring for the lifecycle.

    `plugins` is the plugin manager's `ReporterPlugin` channel, `checkpoints` the agent's
    checkpoint store (None: no checkpoint, for tests and a state-less run), `in_tree` the
    enabled in-tree reporters, `clock` the wall clock of `stopped_at`, `run_sync` how blocking
    work runs (a worker thread; tests on a mock clock run it inline, as a clock that jumps
    while a thread works would expire entries under the test).
    """

    @property
    def _settings(self) -> ReporterSettings:
        return self._live.value  # the newest: grace and sync_interval are live

    def __init__(
        self,
        plugins: LatestValue[Mapping[str, PluginData]],
        settings: LatestValue[ReporterSettings],
        checkpoints: CheckpointStore | None,
        *,
        in_tree: Sequence[InTreeReporter] = (),
        clock: Callable[[], float] = time.time,
        run_sync: RunSync = _in_thread,
    ) -> None:
        self._plugins = plugins
        self._live = settings
        self._checkpoints = checkpoints
        self._in_tree = list(in_tree)
        self._clock = clock
        self._run_sync = run_sync
        self._entries: dict[str, _Entry] = {}
        self._seen: dict[str, PluginData] = {}  # the channel's items already taken in
        self._dirty = Wake()  # the checkpoint is behind the entries
        self._changes = 0  # entry changes, ever
        # How many of `_changes` the checkpoint on disk holds (bumped after each write).
        self._checkpointed: LatestValue[int] = LatestValue(0)
        # Stopped plugins: when their report is dropped.
        self._expiries: Deadlines[str] = Deadlines()
        self.latest: LatestValue[Mapping[str, PluginReport]] = LatestValue(MappingProxyType({}))
        self.checkpoint_writes = 0

    async def checkpoint_synced(self) -> None:
        """Wait until the checkpoint holds every change made so far (no-op without one)."""
        if self._checkpoints is None:
            return
        target = self._changes
        while self._checkpointed.value < target:
            await self._checkpointed.wait_newer(self._checkpointed.version)

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Restore the checkpoint, then follow the channel and the in-tree reporters until
        cancelled; started() once the restored reports (and the first in-tree collection) are
        published."""
        self._entries.clear()
        self._expiries.clear()
        self._seen.clear()
        await self._restore()
        for reporter in self._in_tree:
            await self._collect(reporter)
        version = self._plugins.version
        self._take(self._plugins.value)
        self._publish()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_plugins, version)
            nursery.start_soon(self._expire_loop)
            nursery.start_soon(self._checkpoint_loop)
            if self._in_tree:
                nursery.start_soon(self._collect_loop)
            task_status.started()

    async def _follow_plugins(self, version: int) -> None:
        while True:
            version, plugins = await self._plugins.wait_newer(version)
            if self._take(plugins):
                self._publish()

    async def _collect_loop(self) -> None:
        while True:
            await trio.sleep(self._settings.sync_interval)
            changed = False
            for reporter in self._in_tree:
                changed |= await self._collect(reporter)
            if changed:
                self._publish()

    async def _collect(self, reporter: InTreeReporter) -> bool:
        try:
            response = await self._run_sync(reporter.collect)
        except Exception as exc:
            metrics.IN_TREE_ERRORS.labels(plugin=reporter.name).inc()
            log.warning(
                "in-tree reporter failed; keeping its last report",
                plugin=reporter.name,
                error=repr(exc),
            )
            return False
        return self._update(reporter.name, response, running=True)

    # -- the lifecycle -----------------------------------------------------------------------

    def _take(self, plugins: Mapping[str, PluginData]) -> bool:
        """Take in what changed in the channel; True if any entry changed."""
        changed = False
        for name, data in plugins.items():
            if self._seen.get(name) is data:
                continue
            self._seen[name] = data
            # Here, not at the top: a node with no reporter plugins need not load protobuf.
            from nodeagent.protos.reporterplugin.v1alpha1.api_pb2 import (
                GetReportContentResponse,
            )

            if not isinstance(data.message, GetReportContentResponse):
                log.error("not a reporter message; ignored", plugin=name, type=data.plugin_type)
                continue
            changed |= self._update(name, data.message, running=data.registered and data.live)
        for name in [n for n in self._seen if n not in plugins]:
            # The plugin layer forgot it (its own grace): ours decides from here.
            del self._seen[name]
            entry = self._entries.get(name)
            if entry is not None and entry.running:
                self._stop(name, entry, self._settings.grace)
                changed = True
        return changed

    def _update(self, name: str, response: Report, *, running: bool) -> bool:
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(response, running=True, stopped_at=None)
            if not running:
                self._stop(name, entry, self._settings.grace)
            self._mark_dirty()
            return True
        changed = False
        if response != entry.response:
            entry.response = response
            changed = True
        if running and not entry.running:
            entry.running, entry.stopped_at = True, None
            self._expiries.discard(name)
            log.info("reporter plugin running; its report carried over", plugin=name)
            changed = True
        elif not running and entry.running:
            self._stop(name, entry, self._settings.grace)
            changed = True
        if changed:
            self._mark_dirty()
        return changed

    def _mark_dirty(self) -> None:
        self._changes += 1
        self._dirty.set()

    def _stop(self, name: str, entry: _Entry, remaining: float, *, restored: bool = False) -> None:
        entry.running = False
        entry.stopped_at = self._clock()
        self._expiries.set_after(name, remaining)
        if not restored:  # restored entries are logged together
            log.info("reporter plugin stopped; its report is kept for the grace", plugin=name)

    async def _expire_loop(self) -> None:
        while True:
            expired = [n for n in await self._expiries.wait_due() if n in self._entries]
            for name in expired:
                del self._entries[name]
                metrics.EXPIRED.inc()
                log.info("stopped reporter plugin's report dropped after the grace", plugin=name)
            if expired:
                self._mark_dirty()
                self._publish()

    def _publish(self) -> None:
        reports = {name: entry.report(name) for name, entry in sorted(self._entries.items())}
        running = sum(1 for e in self._entries.values() if e.running)
        metrics.PLUGINS.labels(state="running").set(running)
        metrics.PLUGINS.labels(state="stopped").set(len(self._entries) - running)
        self.latest.set(MappingProxyType(reports))

    # -- the checkpoint ----------------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        """Write the checkpoint after every change; a burst of changes during a write is one
        more write (the newest state), not one each."""
        if self._checkpoints is None:
            return
        try:
            while True:
                await self._dirty.wait()
                await self._write_checkpoint()
        finally:
            if self._checkpointed.value < self._changes:
                # Stopping (SIGTERM) with changes not on disk yet: written on the way out, or
                # the next start restores an older state than the CNR holds and its first sync
                # writes the difference. Bounded here and by the agent's shutdown deadline.
                with trio.CancelScope(shield=True), trio.move_on_after(FLUSH_TIMEOUT):
                    await self._write_checkpoint()

    async def _write_checkpoint(self) -> None:
        assert self._checkpoints is not None
        changes = self._changes
        data = encode_checkpoint(self._entries, self._clock())
        try:
            await self._run_sync(self._checkpoints.write, CHECKPOINT_NAME, data)
        except OSError:
            # Logged and counted by the checkpoint store; the next change writes again.
            return
        self.checkpoint_writes += 1
        self._checkpointed.set(changes)

    async def _restore(self) -> None:
        if self._checkpoints is None:
            return
        try:
            read = await self._run_sync(self._checkpoints.read, CHECKPOINT_NAME)
        except OSError as exc:
            metrics.CHECKPOINT_INVALID.inc()
            log.warning("reporter checkpoint unreadable; starting fresh", error=str(exc))
            return
        if read.state is not CheckpointState.FOUND or read.data is None:
            # NOT_FOUND: a first start. CORRUPT: moved aside, logged and counted by the store.
            return
        try:
            restored = decode_checkpoint(read.data)
        except ValueError as exc:
            metrics.CHECKPOINT_INVALID.inc()
            log.warning("reporter checkpoint content invalid; starting fresh", error=str(exc))
            return
        now, grace = self._clock(), self._settings.grace
        for name, (response, stopped_at) in restored.items():
            entry = self._entries[name] = _Entry(response, running=True, stopped_at=None)
            # A plugin running when the agent stopped gets the whole grace to come back; one
            # already stopped keeps what was left of it (the wall clock spans the restart).
            elapsed = 0.0 if stopped_at is None else min(max(now - stopped_at, 0.0), grace)
            self._stop(name, entry, grace - elapsed, restored=True)
            if stopped_at is not None:
                entry.stopped_at = stopped_at
        log.info(
            "reporter checkpoint restored; its plugins are stopped until they deliver again",
            plugins=sorted(restored),
        )


def encode_checkpoint(entries: Mapping[str, _Entry], now: float) -> bytes:
    """The checkpoint payload: JSON, each plugin's serialized GetReportContentResponse in
    base64 with its stop time (null while running)."""
    plugins: dict[str, Any] = {
        name: {
            "response": base64.b64encode(entry.response.SerializeToString()).decode(),
            "stopped_at": entry.stopped_at,
        }
        for name, entry in sorted(entries.items())
    }
    document = {"version": _CHECKPOINT_VERSION, "written_at": now, "plugins": plugins}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def decode_checkpoint(data: bytes) -> dict[str, tuple[Report, float | None]]:
    """Plugin name -> (report, stop time); ValueError naming what is wrong. Reports come back
    as PlainReport (no protobuf: a restart with only the system reporter's report stays
    protobuf-free)."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != _CHECKPOINT_VERSION:
        raise ValueError(f"not a version {_CHECKPOINT_VERSION} reporter checkpoint")
    plugins = document.get("plugins")
    if not isinstance(plugins, dict):
        raise ValueError("plugins: must be an object")
    out: dict[str, tuple[Report, float | None]] = {}
    for name, item in plugins.items():
        if not isinstance(item, dict):
            raise ValueError(f"plugins.{name}: must be an object")
        stopped_at = item.get("stopped_at")
        if stopped_at is not None and (
            not isinstance(stopped_at, int | float) or isinstance(stopped_at, bool)
        ):
            raise ValueError(f"plugins.{name}.stopped_at: must be a number or null")
        try:
            raw = base64.b64decode(item.get("response", ""), validate=True)
            response = parse_report(raw)
        except (TypeError, binascii.Error, ValueError) as exc:
            raise ValueError(f"plugins.{name}.response: {exc}") from None
        out[name] = (response, None if stopped_at is None else float(stopped_at))
    return out
