"""The dynamic-config component (cluster mode, ``dynconfig.enabled``): watches NodeAgentConfig
objects and this node's Node (its labels) through its own accumulator, selects the target and
drives the controller (assign / keep / confirm), runs the controller's trials, and writes what
it decides: the NodeAgentConfigOK condition on nodes/<node>/status (only when it changed: the
one write per config change) and Events on the Node.

A cluster that does not serve the CRD keeps the component ready (the local or checkpointed
config runs) and the kind is looked for again every `retry` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings, ObjectMap, Query, Watch
from nodeagent.config.loader import Override, apply_overrides, read_config_file
from nodeagent.core.backoff import Backoff
from nodeagent.core.component import Readiness
from nodeagent.core.errors import ConfigError
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.core.wake import Wake
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.health import ComponentHealth
from nodeagent.dynconfig.overlay import config_hash, overlay_raw
from nodeagent.dynconfig.source import GROUP, KIND, VERSION, decode_object, select_target
from nodeagent.dynconfig.state import Assignment
from nodeagent.dynconfig.status import CONDITION_TYPE, Condition, ConfigEvent, condition_patch
from nodeagent.kube import NODES, EventRecorder, KubeClient, KubeError, NotFound
from nodeagent.log import get_logger
from nodeagent.service.config import Config, build_config

log = get_logger(__name__)

__all__ = ["ConfigBuilder", "DynconfigComponent", "EventBuffer"]

API_VERSION = f"{GROUP}/{VERSION}"
# Seconds between looks at the queries' states while a selection waits for both to be known.
RECHECK_WHILE_OWED = 1.0
# The condition's first write waits this long at most for the Node to be listed, so that it
# keeps the lastTransitionTime the Node shows (and is not written at all when unchanged).
NODE_LISTED_WAIT = 5.0


class ConfigBuilder:
    """Effective config = defaults, the file, the flags, then a remote overlay (None: none).

    The file is read once and again only on `reread()` (SIGHUP), so a remote change never
    picks up an edit of the file that was not asked for."""

    def __init__(self, path: str | None, overrides: Sequence[Override] = ()) -> None:
        self.path = path
        self.overrides = list(overrides)
        self.raw = self._read()

    def _read(self) -> dict[str, Any]:
        raw, _ = read_config_file(self.path)
        return apply_overrides(raw, self.overrides)

    def reread(self) -> Callable[[], None]:
        """Re-read the file (ConfigError: the previous file stays in use); returns the undo
        that puts the previous file back (a reload refused or rolled back after its trial)."""
        raw = self._read()
        build_config(raw)
        previous, self.raw = self.raw, raw

        def undo() -> None:
            self.raw = previous

        return undo

    @property
    def file_hash(self) -> str:
        """The identity of the file and flags in use (shown in status, remembered when bad)."""
        return config_hash(self.raw)

    def __call__(self, remote: Mapping[str, Any] | None) -> Config:
        if not remote:
            return build_config(self.raw)
        return build_config(overlay_raw(self.raw, remote))


async def _forward(acc: Accumulator, wake: Wake) -> None:
    """Changes of either accumulator are one wake-up (level-triggered: the loop then updates
    both)."""
    while True:
        await acc.changed()
        wake.set()


class _Snap:
    configs: ObjectMap[dict[str, Any]]
    node: ObjectMap[dict[str, Any]]


class EventBuffer:
    """The controller's events (its `on_event`), logged and given to the process's Event
    recorder, which keeps them until the client exists (the controller boots before the
    apiserver answers). Without a recorder (tests), one of its own, which the component
    attaches and runs."""

    def __init__(self, recorder: EventRecorder | None = None) -> None:
        # Ours (no process recorder): the component attaches and runs it.
        self.owned = recorder is None
        self.recorder = recorder if recorder is not None else EventRecorder(backlog=64)
        self._reasons: set[str] = set()

    def __call__(self, event: ConfigEvent) -> None:
        log.info("dynconfig event", type=event.type, reason=event.reason, message=event.message)
        self._reasons.add(event.reason)
        self.recorder.record(event.type, event.reason, event.message)

    def posted(self) -> int:
        """Events of the controller posted (created, or their count updated)."""
        return sum(self.recorder.posted.get(r, 0) for r in self._reasons)


class DynconfigComponent:
    name = "dynconfig"

    def __init__(
        self,
        *,
        node_name: str,
        controller: Controller[Any],
        events: EventBuffer,
        client: KubeClient,
        accumulator_settings: AccumulatorSettings,
        reports: Callable[[], Sequence[ComponentHealth]],
        watchdog_age: Callable[[], float | None] = lambda: None,
        answering: Callable[[], bool] = lambda: True,
        retry: float = 30.0,
        watch: Watch | None = None,
    ) -> None:
        """``answering``: whether the apiserver answers now (the process's `kube` component);
        a live, unchanged assignment is confirmed only while it does."""
        self.node_name = node_name
        self.controller = controller
        self.events = events
        # The process's recorder is attached and run by the process; a recorder of our own
        # posts through our client while we run.
        self._own_recorder = events.owned
        if self._own_recorder:
            events.recorder.attach(client, node_name)
        self._client = client
        self._accumulator_settings = accumulator_settings
        self._reports = reports
        self._watchdog_age = watchdog_age
        self._answering = answering
        # The last selection assigned a target (or none) and nothing changed since that it did
        # not select: what the watch shows confirms the assignment (not during a tie, an
        # unreadable target or a selection owed).
        self._selected = False
        self._retry = retry
        self._watch = watch  # the accumulators' watch (None: through the client; tests: a fake)
        self.accumulators: list[Accumulator] = []
        self.crd_missing: str | None = None
        self.started = False
        self.selection_reason = "not selected yet"
        self.invalid: list[tuple[str, str]] = []
        self.written: Condition | None = None
        # The UID of the Node the last condition was written to, and an event set when a Node
        # of another UID (deleted and re-created by its kubelet) lacks it: written again.
        self._written_uid: str | None = None
        # The Node as last seen (None: not seen yet): its condition's lastTransitionTime is
        # kept while the status stays, and an agent restarted on an unchanged condition
        # does not write it again.
        self._node_seen: dict[str, Any] | None = None
        # (status, lastTransitionTime) of this process's last condition write: newer than any
        # Node view it holds (the watch of the Node lags behind our own writes).
        self._transition: tuple[str, str] | None = None
        self._node_listed = trio.Event()
        self._lost = Wake()
        self.condition_error: str | None = None
        self.condition_writes = 0
        self._status_failing: Lapses[str] = Lapses("dynconfig", "node_status_writes")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.accumulators, self.crd_missing, self.started = [], None, False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.controller.run_trials, self._reports, self._watchdog_age)
            if self._own_recorder:
                nursery.start_soon(self.events.recorder.run)
            nursery.start_soon(self._write_conditions)
            # Started before any cluster lookup: the local (or checkpointed) config runs
            # meanwhile, and READY must not wait for an apiserver that does not answer.
            self.started = True
            task_status.started()
            while True:
                if await self._crd_served():
                    break
                self._node_listed.set()  # no Node view to wait for: the condition goes now
                await trio.sleep(self._retry)  # an optional kind: looked for again
            self.crd_missing = None
            # Two accumulators: the Node's status changes often (the kubelet, and this
            # component's own condition write), and in one accumulator each would hold the next
            # NodeAgentConfig change back for accumulator.max_interval.
            configs = Accumulator(
                self._client,
                [Query("configs", API_VERSION, KIND, into=dict[str, Any])],
                self._accumulator_settings,
                watch=self._watch,
            )
            node = Accumulator(
                self._client,
                [
                    Query(
                        "node",
                        "v1",
                        "Node",
                        field_selector=f"metadata.name={self.node_name}",
                        into=dict[str, Any],
                    )
                ],
                self._accumulator_settings,
                watch=self._watch,
            )
            self.accumulators = [configs, node]
            wake = Wake()
            for acc in self.accumulators:
                await nursery.start(acc.run)
                nursery.start_soon(_forward, acc, wake)
            nursery.start_soon(self._keep_confirmed)
            snap = _Snap()
            labels: dict[str, str] | None = None
            # A selection is owed from the first change it could not run for until it runs: a
            # change seen while the other query relists (or is unreadable) is selected once
            # both are known again, although that relist may change neither input.
            owed = False
            while True:
                if owed:
                    # The end of a relist that found no difference wakes no one: look again.
                    await wake.wait_for(RECHECK_WHILE_OWED)
                else:
                    await wake.wait()
                if configs.update(snap):
                    owed = True
                if node.update(snap):
                    self._check_condition(snap)
                    if node.bootstrapped:
                        self._node_listed.set()
                    new_labels = self._labels(snap)
                    # Status-only changes of the Node (heartbeats, our condition) select nothing.
                    owed = owed or new_labels != labels
                    labels = new_labels
                ready = owed and configs.bootstrapped
                if labels is not None and ready and self._known():
                    owed = False
                    self._select(snap, labels)
                if owed:
                    self._selected = False

    async def _keep_confirmed(self) -> None:
        """A live, unchanged assignment stays confirmed (issue 29 item 3: only a selection
        confirmed it, so after quiet hours a clean restart found the checkpoint expired): every
        quarter grace, while the apiserver answers, both queries are known and the last
        selection stands, the controller confirms (it writes at most once a quarter grace)."""
        every = self.controller.settings.checkpoint_grace / 4
        while True:
            await trio.sleep(every)
            known = all(s.known for acc in self.accumulators for s in acc.statuses().values())
            if self._selected and known and self._answering():
                self.controller.confirm()

    async def _crd_served(self) -> bool:
        try:
            await self._client.discover(API_VERSION, KIND)
            return True
        except NotFound as exc:
            self.crd_missing = str(exc)
            return False
        except KubeError as exc:
            self.crd_missing = f"discovery failed: {exc}"
            log.warning("discovering the NodeAgentConfig kind failed: retrying", error=str(exc))
            return False

    def _known(self) -> bool:
        # A Forbidden or failed list shows as empty: taking it for "no object targets this
        # node" would drop a running remote config; keep it and say why instead.
        unknown = {
            name: s.reason
            for acc in self.accumulators
            for name, s in acc.statuses().items()
            if not s.known
        }
        if unknown:
            self.selection_reason = f"not selecting: {unknown}"
            self.controller.keep(f"NodeAgentConfig objects not readable ({unknown})")
        return not unknown

    def _labels(self, snap: _Snap) -> dict[str, str]:
        node = snap.node.lookup("", self.node_name)
        return dict(((node or {}).get("metadata") or {}).get("labels") or {})

    def _select(self, snap: _Snap, labels: dict[str, str]) -> None:
        objects = []
        invalid: list[tuple[str, str]] = []
        assigned = self.controller.state.assigned
        unreadable_target: tuple[str, str] | None = None
        for raw in snap.configs.values_list():
            try:
                objects.append(decode_object(raw))
            except ConfigError as exc:
                meta = raw.get("metadata") or {}
                name = meta.get("name", "?")
                invalid.append((name, str(exc)))
                if assigned is not None and _same_object(meta, assigned.name, assigned.uid):
                    unreadable_target = (name, str(exc))
        selection = select_target(objects, self.node_name, labels)
        self.selection_reason = selection.reason
        self.invalid = invalid + selection.invalid
        if self.invalid:
            log.warning("NodeAgentConfig objects not usable", invalid=self.invalid)
        self._selected = unreadable_target is None and not selection.tie
        if unreadable_target is not None:
            # Whether it still targets this node cannot be told: keep what runs, say why.
            self.selection_reason = f"not selecting: the target {unreadable_target[0]} unreadable"
            self.controller.unreadable(*unreadable_target)
            return
        if selection.tie:
            self.controller.keep(selection.reason)
            return
        target = selection.target
        if target is None:
            self.controller.assign(None, self._reports())
            return
        meta = target.metadata
        self.controller.assign(
            Assignment(
                name=meta.name,
                uid=meta.uid,
                generation=meta.generation,
                config=dict(target.spec.config or {}),
            ),
            self._reports(),
        )

    def _check_condition(self, snap: _Snap) -> None:
        """Whether a re-created Node (another UID than the one written to) lacks the condition
        written last; if so (found by the fault matrix: it stayed lost until the next config
        change), forget it so that the writer writes it again. The same Node seen without it
        is an older state than our write's, not a loss."""
        node = snap.node.lookup("", self.node_name)
        self._node_seen = node
        if self.written is None or self._written_uid is None:
            return
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if node is None or uid == self._written_uid:
            return  # deleted: written again once it exists (its patch until then would 404)
        want = ("True" if self.written.status else "False", self.written.reason)
        conditions = (node.get("status") or {}).get("conditions") or []
        have = [
            (c.get("status"), c.get("reason"))
            for c in conditions
            if c.get("type") == CONDITION_TYPE
        ]
        if have != [want]:
            log.info("NodeAgentConfigOK condition missing on the Node: writing it again")
            self.written = None
            self._lost.set()

    async def _write_conditions(self) -> None:
        # A refused write (RBAC without nodes/status) is retried with backoff, not per change.
        backoff = Backoff(1.0, 60.0)
        with trio.move_on_after(NODE_LISTED_WAIT):
            await self._node_listed.wait()
        while True:
            changed = self.controller.changed
            self._lost.clear()
            condition = self.controller.condition()
            if condition != self.written and not self._adopt(condition):
                await self._patch_condition(condition)
                if self.condition_error is not None:
                    await trio.sleep(backoff.next())
                    continue
                backoff.reset()
            elif self.condition_error is not None:
                # Nothing left to write (the condition wanted went back to the one written
                # while a write failed): the failure is moot, not a status write failing.
                log.info("NodeAgentConfigOK condition as written: the failed write is moot")
                self.condition_error = None
                backoff.reset()
            if self.controller.condition() == self.written:
                async with trio.open_nursery() as nursery:  # whichever comes first
                    for wait in (changed.wait, self._lost.wait):
                        nursery.start_soon(_cancel_when, wait, nursery.cancel_scope)

    def _shown(self) -> dict[str, Any] | None:
        """Our condition as the Node last seen shows it."""
        status = (self._node_seen or {}).get("status") or {}
        for c in status.get("conditions") or []:
            if c.get("type") == CONDITION_TYPE:
                return dict(c)
        return None

    def _adopt(self, condition: Condition) -> bool:
        """At start, before this process wrote anything: a Node already showing exactly
        `condition` (left by the previous run) is taken as written, not written again. Later
        the Node seen may predate our own last write, so it is never trusted that way."""
        shown = self._shown()
        if self.condition_writes or self.written is not None or shown is None:
            return False
        same = (
            shown.get("status") == ("True" if condition.status else "False")
            and shown.get("reason") == condition.reason
            and shown.get("message") == condition.message
        )
        if same:
            self.written = condition
            self._written_uid = ((self._node_seen or {}).get("metadata") or {}).get("uid")
        return same

    async def _patch_condition(self, condition: Condition) -> None:
        status = "True" if condition.status else "False"
        # The time the status last changed: our own last write's once there is one (the Node
        # seen may predate it: True -> False -> True kept the first time), else the Node's.
        last = self._transition
        if last is None:
            shown = self._shown() or {}
            last = (str(shown.get("status")), str(shown.get("lastTransitionTime") or ""))
        kept = (last[1] or None) if last[0] == status else None
        body = condition_patch(condition, time.time(), transitioned=kept)
        try:
            answer = await self._client.patch(
                NODES, self.node_name, body, type="strategic", subresource="status"
            )
        except KubeError as exc:
            self.condition_error = str(exc)
            log.warning("NodeAgentConfigOK condition not written", error=str(exc))
            return
        self.condition_error = None
        self.condition_writes += 1
        self._transition = (status, body["status"]["conditions"][0]["lastTransitionTime"])
        self.written = condition
        self._written_uid = _uid(answer)

    @property
    def events_posted(self) -> int:
        """Events posted on the Node (apply, veto, invalid, rollback)."""
        return self.events.posted()

    def readiness(self) -> Readiness:
        if not self.started:
            return False, "starting"
        if self.crd_missing is not None:
            return True, (
                f"the NodeAgentConfig CRD is not served ({self.crd_missing}): running "
                f"{self.controller.active.name} config"
            )
        if not self.accumulators:
            return True, (
                f"looking for the NodeAgentConfig kind: running {self.controller.active.name} "
                "config"
            )
        # The Node's status (the condition) not writable: bounded, a control-plane restart
        # must not flip readiness (nor roll a trial back).
        now, bound = trio.current_time(), self.controller.settings.status_write_bound
        failing = {"condition": self.condition_error} if self.condition_error else {}
        lapses = self._status_failing.observe(failing, now)
        what = "writing the NodeAgentConfigOK condition fails"
        if overdue(lapses, now, bound) is not None:
            return False, describe(what, lapses[0], now, bound)
        writing = "; " + describe(what, lapses[0], now, bound) if lapses else ""
        problems = [r for acc in self.accumulators if (r := acc.not_ready_reason())]
        if problems:
            watching = "watching NodeAgentConfig objects (" + "; ".join(problems) + ")"
            return True, watching + writing
        condition = self.controller.condition()
        return True, f"{condition.reason}: {condition.message}{writing}"

    def view(self) -> dict[str, Any]:
        return {
            **self.controller.status(),
            "selection": self.selection_reason,
            "invalid": [{"name": n, "reason": r} for n, r in self.invalid],
            "crd_missing": self.crd_missing,
            "condition_writes": self.condition_writes,
            "events_posted": self.events_posted,
            "condition_error": self.condition_error,
        }


def _same_object(meta: Mapping[str, Any], name: str, uid: str) -> bool:
    """Whether raw metadata is the object assigned (by UID; by name when either has none)."""
    other = meta.get("uid")
    if uid and isinstance(other, str) and other:
        return other == uid
    return meta.get("name") == name


async def _cancel_when(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()


def _uid(node: bytes) -> str | None:
    """metadata.uid of a Node the server returned (None if it cannot be read)."""
    try:
        uid = msgspec.json.decode(node, type=_NodeHead).metadata.uid
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return uid or None


class _Meta(msgspec.Struct):
    uid: str = ""


class _NodeHead(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
