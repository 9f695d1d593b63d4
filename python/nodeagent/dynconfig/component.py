"""The dynamic-config component (cluster mode, ``dynconfig.enabled``): watches NodeAgentConfig
objects and this node's Node (its labels) through its own accumulator, selects the target and
drives the controller (assign / keep / confirm), runs the controller's trials, and writes what
it decides: the NodeAgentConfigOK condition on nodes/<node>/status (`condition.py`) and Events
on the Node (through the process's recorder).

A cluster that does not serve the CRD keeps the component ready (the local or checkpointed
config runs) and the kind is looked for again every `retry` seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings, ObjectMap, Query, Watch
from nodeagent.core.component import Readiness
from nodeagent.core.errors import ConfigError
from nodeagent.core.wake import Wake
from nodeagent.dynconfig.admission import gate
from nodeagent.dynconfig.condition import ConditionWriter
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.health import ComponentHealth
from nodeagent.dynconfig.source import GROUP, KIND, VERSION, decode_object, select_target
from nodeagent.dynconfig.state import Assignment
from nodeagent.dynconfig.status import ConfigEvent
from nodeagent.kube import EventRecorder, KubeClient, lookup_kind
from nodeagent.log import get_logger

log = get_logger(__name__)

__all__ = ["DynconfigComponent", "EventBuffer"]

API_VERSION = f"{GROUP}/{VERSION}"
# Seconds between looks at the queries' states while a selection waits for both to be known.
RECHECK_WHILE_OWED = 1.0


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
    apiserver answers); the process attaches and runs it."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
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
        # The NodeAgentConfigOK condition, from the Node this component watches.
        self.condition = ConditionWriter(node_name=node_name, controller=controller, client=client)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.accumulators, self.crd_missing, self.started = [], None, False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.controller.run_trials, self._reports, self._watchdog_age)
            nursery.start_soon(self.condition.run)
            # Started before any cluster lookup: the local (or checkpointed) config runs
            # meanwhile, and READY must not wait for an apiserver that does not answer.
            self.started = True
            task_status.started()
            while True:
                if await self._crd_served():
                    break
                self.condition.listed()  # no Node view to wait for: the condition goes now
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
                    self.condition.seen(snap.node.lookup("", self.node_name))
                    if node.bootstrapped:
                        self.condition.listed()
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
        found = await lookup_kind(self._client, API_VERSION, KIND)
        self.crd_missing = found.missing
        if found.error is not None:
            self.crd_missing = f"discovery failed: {found.error}"
        return found.served

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
        config = dict(target.spec.config or {})
        # The object's rollout (issue 31), judged on every selection: a change of its status
        # alone (the controller moving the threshold) is one, and admits the node then.
        rollout = gate(target, self.node_name, labels, self.controller.hasher(config))
        self.controller.assign(
            Assignment(name=meta.name, uid=meta.uid, generation=meta.generation, config=config),
            self._reports(),
            rollout,
        )

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
        overdue, writing = self.condition.failing(self.controller.settings.status_write_bound)
        if overdue:
            return False, writing
        writing = "; " + writing if writing else ""
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
            "condition_writes": self.condition.writes,
            "events_posted": self.events_posted,
            "condition_error": self.condition.error,
        }


def _same_object(meta: Mapping[str, Any], name: str, uid: str) -> bool:
    """Whether raw metadata is the object assigned (by UID; by name when either has none)."""
    other = meta.get("uid")
    if uid and isinstance(other, str) and other:
        return other == uid
    return meta.get("name") == name
