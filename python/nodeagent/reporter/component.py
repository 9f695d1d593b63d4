"""The reporter as a supervised component: the report store (each reporter plugin's last report,
checkpointed) and the CNR writer.

Cluster mode: a dedicated accumulator over this node's CustomNodeResource (`update()` drains it,
so no other consumer may share it) and a writer through the process's one client.
Standalone: the merge alone, which /v1/cnr and ``nodeagent status`` show.

Each run builds a fresh store (restored from the checkpoint), accumulator and writer: a
restarted component starts from the checkpointed reports and the observed CNR, and writes
nothing when they agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings
from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.backoff import Backoff
from nodeagent.core.component import Readiness
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import EventRecorder, KubeClient, lookup_kind
from nodeagent.log import get_logger
from nodeagent.reporter.cnr import CnrWriter, cnr_query
from nodeagent.reporter.merge import CNR_API_VERSION, CNR_KIND
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.reporter.store import InTreeReporter, ReportStore
from nodeagent.reporter.system import SystemReporter

log = get_logger(__name__)

__all__ = ["ReporterComponent", "cnr_summary"]


class ReporterComponent:
    name = "reporter"

    def __init__(
        self,
        *,
        node_name: str,
        plugins: LatestValue[Mapping[str, PluginData]],
        settings: LatestValue[ReporterSettings],
        accumulator_settings: AccumulatorSettings,
        state_dir: str | None,
        client: KubeClient | None = None,
        in_tree: Sequence[InTreeReporter] | None = None,
        dry_run: bool = False,
        events: EventRecorder,
    ) -> None:
        self.node_name = node_name
        self._events = events  # the process's recorder
        self._plugins = plugins
        self._live = settings
        self._accumulator_settings = accumulator_settings
        self._checkpoints = (
            # A dry run reads the checkpoint a real agent left and writes none.
            CheckpointStore(Path(state_dir) / "checkpoints", node=node_name, read_only=dry_run)
            if state_dir is not None
            else None
        )
        self._client = client
        if in_tree is None:
            first = settings.value
            in_tree = (
                [SystemReporter(cpu_flags=first.cpu_flags, cpu_model=first.cpu_model)]
                if first.system_reporter
                else []
            )
        self._in_tree = list(in_tree)
        self.store: ReportStore | None = None
        self.accumulator: Accumulator | None = None
        self.writer: CnrWriter | None = None
        # Why the CNR is not written although connected: its CRD is not served.
        self.crd_missing: str | None = None
        # Why the CNR kind is not known yet: discovery failed (the apiserver does not answer).
        self.discovery_error: str | None = None
        # CNR writes failing after it was once in sync, bounded by reporter.cnr_failure_bound.
        self._write_failing: Lapses[str] = Lapses(self.name, "cnr_writes")
        # Discovery answered once in this run: failing later (the CRD looked for again while
        # the control plane restarts) is bounded by cnr_failure_bound like a failing write.
        self._answered = False
        self._discovery_failing: Lapses[str] = Lapses(self.name, "cnr_discovery")
        # A lookup of the kind is in flight (the first one runs after the component started).
        self.looking_up = False

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return self._checkpoints

    @property
    def _settings(self) -> ReporterSettings:
        return self._live.value

    @property
    def standalone(self) -> bool:
        return self._client is None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        store = ReportStore(self._plugins, self._live, self._checkpoints, in_tree=self._in_tree)
        self.store, self.accumulator, self.crd_missing = store, None, None
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            if self._client is None:
                await nursery.start(self._merge_only, store)
                task_status.started()
                return
            client = self._client
            # Started before the kind is looked up: a cluster without the CRD, or an apiserver
            # that does not answer yet (a node booted before its control plane, a lookup that
            # hangs), must not hold the agent's other work or its READY to systemd. The merge
            # is shown meanwhile; the kind is looked for again (a missing CRD every
            # cnr_retry_max, an unanswered discovery sooner, with backoff).
            merging = trio.CancelScope()
            await nursery.start(self._merge_only, store, merging)
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            if not await self._crd_served(client):
                retry = Backoff(self._settings.cnr_retry_initial, self._settings.cnr_retry_max)
                while True:
                    wait = self._settings.cnr_retry_max if self.crd_missing else retry.next()
                    await trio.sleep(wait)
                    if await self._crd_served(client):
                        break
            merging.cancel()
            self.crd_missing = None
            acc = Accumulator(client, [cnr_query(self.node_name)], self._accumulator_settings)
            writer = CnrWriter(
                node_name=self.node_name,
                reports=store.latest,
                settings=self._live,
                client=client,
                accumulator=acc,
                events=self._events,
            )
            self.accumulator, self.writer = acc, writer
            await nursery.start(acc.run)
            await nursery.start(writer.run)
            task_status.started()

    async def _merge_only(
        self,
        store: ReportStore,
        scope: trio.CancelScope | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        writer = CnrWriter(
            node_name=self.node_name, reports=store.latest, settings=self._live, events=self._events
        )
        self.writer = writer
        with scope if scope is not None else trio.CancelScope():
            await writer.run(task_status=task_status)

    async def _crd_served(self, client: KubeClient) -> bool:
        """Whether the apiserver serves the CNR kind (False also when discovery fails)."""
        self.looking_up = True
        try:
            found = await lookup_kind(client, CNR_API_VERSION, CNR_KIND)
        finally:
            self.looking_up = False
        self.crd_missing, self.discovery_error = found.missing, found.error
        # Served or not, the apiserver answered (a failed discovery keeps what was known).
        self._answered = self._answered or found.error is None
        return found.served

    def readiness(self) -> Readiness:
        writer, acc = self.writer, self.accumulator
        if writer is None:
            return False, "starting"
        merged = writer.merged
        bad = merged.bad if merged is not None else ()
        fields = len(merged.reported) if merged is not None else 0
        problems = f"; skipped {len(bad)} bad fields (first: {bad[0].describe()})" if bad else ""
        if self.discovery_error is not None and self._answered:
            now, bound = trio.current_time(), self._settings.cnr_failure_bound
            lapses = self._discovery_failing.observe({"cnr": self.discovery_error}, now)
            what = "looking for the CustomNodeResource kind fails"
            if overdue(lapses, now, bound) is None:
                return True, f"{describe(what, lapses[0], now, bound)}: {fields} CNR fields merged"
            return False, f"{describe(what, lapses[0], now, bound)}: {fields} CNR fields merged"
        self._discovery_failing.clear()
        if self.discovery_error is not None:
            return False, (
                f"looking for the CustomNodeResource kind fails ({self.discovery_error}): "
                f"{fields} CNR fields merged, not written{problems}"
            )
        if self.looking_up and self.crd_missing is None:
            return False, (
                "looking for the CustomNodeResource kind (the apiserver has not answered yet): "
                f"{fields} CNR fields merged, not written{problems}"
            )
        if self.crd_missing is not None:
            return True, (
                f"the CustomNodeResource CRD is not installed ({self.crd_missing}): {fields} CNR "
                f"fields merged, not written{problems}"
            )
        if writer.standalone:
            return True, f"standalone: {fields} CNR fields merged, not written{problems}"
        if acc is not None and (unready := acc.unready_reason()) is not None:
            return False, f"reading this node's CNR ({unready})"
        now, bound = trio.current_time(), self._settings.cnr_failure_bound
        if writer.error is None:
            self._write_failing.clear()
        elif writer.synced_at is None:
            # Never in sync in this run: nothing to keep serving from, reported at once.
            return False, f"writing the CNR fails: {writer.error}"
        else:
            last_ok = {"cnr": writer.synced_at}
            lapses = self._write_failing.observe({"cnr": writer.error}, now, last_ok)
            if overdue(lapses, now, bound) is not None:
                return False, describe("writing the CNR fails", lapses[0], now, bound)
            problems += "; " + describe("writing the CNR fails", lapses[0], now, bound)
        if writer.synced_at is None:
            return False, "waiting for the first CNR sync"
        if acc is not None and (reading := acc.not_ready_reason()) is not None:
            problems += f"; reading this node's CNR: {reading}"
        state = "in sync" if writer.synced else "not in sync"
        return True, f"{fields} CNR fields {state}{problems}"

    def view(self) -> dict[str, Any]:
        """What /v1/cnr shows."""
        if self.writer is None:
            return {"node": self.node_name, "mode": _mode(self.standalone), "cnr": None}
        doc = self.writer.view()
        if self.crd_missing is not None:
            doc["mode"] = "cluster"
            doc["sync"] = {"crd_missing": self.crd_missing, "synced": False, "writes": 0}
        return doc


def _mode(standalone: bool) -> str:
    return "standalone" if standalone else "cluster"


def cnr_summary(view: Mapping[str, Any]) -> dict[str, Any]:
    """The CNR part of `nodeagent status`: its fields, plugins, bad fields and sync state."""
    cnr = view.get("cnr") or {}
    fields = [
        f"{section}.{name}"
        for section in ("metadata", "spec", "status")
        for name in (cnr.get(section) or {})
        if name != "name"
    ]
    sync = view.get("sync") or {}
    return {
        "fields": fields,
        "plugins": view.get("plugins") or [],
        "bad_fields": view.get("bad_fields") or [],
        "synced": sync.get("synced"),
        "writes": sync.get("writes"),
        "error": sync.get("error"),
    }
