"""The rollout controller's loop: watch the NodeAgentConfigs and the nodes' NodeAgentConfigOK
conditions (one accumulator), and, while leading, plan each rolled-out object
(`rollout.plan.plan`) and write what changed through the status subresource.

- A write carries the resourceVersion the plan was made from: 409 means the object changed
  (an operator's edit, another controller), so the controller reads it again and replans.
- At most one write per object per `write_interval` (the changes in between coalesce into the
  next plan), none when the plan equals the stored status.
- The plan's Events are recorded only once their status is stored, so they are posted once
  (a restarted controller replans from the stored status and gets none).
- The pause between waves is a timer wake-up at the moment it ends, not polling.
"""

from __future__ import annotations

import calendar
import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from nodeagent.accumulator import Accumulator, ObjectMap, Query
from nodeagent.kube import NODES, Conflict, EventRecorder, Involved, KubeClient, KubeError, NotFound
from nodeagent.log import get_logger
from nodeagent.rollout.api import Phase, RolloutStatus
from nodeagent.rollout.plan import Event, plan
from nodeagent.rollout_controller import metrics
from nodeagent.rollout_controller.lease import LeaseElector
from nodeagent.rollout_controller.observe import (
    NODEAGENTCONFIGS,
    NodeView,
    Rollout,
    rollouts,
)
from nodeagent.rollout_controller.settings import ControllerSettings
from nodeagent.rollout_controller.writer import status_document

log = get_logger(__name__)

__all__ = ["Controller", "main"]

# The Events' source and reportingComponent (the host and instance: the controller's identity).
COMPONENT = "nodeagent-rollout-controller"
# Events waiting to be posted: the plan gives one per transition, a fleet's rollout a few dozen.
EVENT_BACKLOG = 1000

# Attempts of one object's write when it keeps conflicting (each a fresh read and a replan);
# past them the next change or timer tries again.
CONFLICT_ATTEMPTS = 3


@dataclass
class _Snap:
    configs: ObjectMap[bytes] = field(default_factory=ObjectMap)
    nodes: ObjectMap[NodeView] = field(default_factory=ObjectMap)


def _parse_stamp(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


class Controller:
    def __init__(
        self,
        client: KubeClient,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.settings = settings
        self._clock = clock
        self.elector = LeaseElector(
            client,
            settings.namespace,
            settings.lease_name,
            settings.identity,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
            on_change=self.poke,
            clock=clock,
        )
        # The process's one recorder (kube.events): Events on the NodeAgentConfigs, in
        # "default" (cluster-scoped objects), repeats of one message on one object aggregated.
        self.recorder = EventRecorder(
            client=client,
            backlog=EVENT_BACKLOG,
            component=COMPONENT,
            host=settings.identity,
            counter=metrics.EVENTS,
        )
        self.accumulator = Accumulator(
            client,
            [
                Query("configs", NODEAGENTCONFIGS.api_version, NODEAGENTCONFIGS),
                Query("nodes", "v1", NODES, into=NodeView),
            ],
        )
        self._scope: trio.CancelScope | None = None
        self._poked = False
        self._last_write: dict[str, float] = {}  # object -> Trio clock of its last write
        self._wake_at: dict[str, float] = {}  # object -> Trio clock to plan it again
        self._phases: dict[str, str] = {}
        self._invalid: dict[str, str] = {}  # object -> why it cannot be rolled out (reported)
        self.plans = 0  # objects planned (for tests and the load script)
        self.writes = 0  # status writes that succeeded
        self.conflicts = 0
        self.alive = False  # the loop runs (/healthz)

    def poke(self) -> None:
        """Plan again now (leadership changed)."""
        self._poked = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.accumulator.run)
            nursery.start_soon(self.elector.run)
            nursery.start_soon(self.recorder.run)
            task_status.started()
            await self._loop()

    async def _loop(self) -> None:
        snap = _Snap()
        self.alive = True
        try:
            while True:
                if not self._poked:
                    deadline = min(self._wake_at.values(), default=math.inf)
                    with trio.move_on_at(deadline) as scope:
                        self._scope = scope
                        await self.accumulator.changed()
                    self._scope = None
                self._poked = False
                if not self.accumulator.bootstrapped:
                    continue
                self.accumulator.update(snap)
                await self.step(snap)
        finally:
            self.alive = False

    async def step(self, snap: _Snap) -> None:
        """Plans every rolled-out object once (the leader only)."""
        due = trio.current_time()
        self._wake_at = {k: v for k, v in self._wake_at.items() if v > due}
        if not self.elector.leading:
            return
        objects = []
        for raw in snap.configs.values_list():
            try:
                objects.append(msgspec.json.decode(raw))
            except msgspec.DecodeError:
                continue  # the accumulator's store holds JSON; never here
        problems: dict[str, str] = {}
        found = rollouts(objects, snap.nodes.values_list(), problems)
        self._report(objects, problems)
        live = {r.name for r in found}
        for gone in [n for n in self._phases if n not in live]:
            self._forget(gone)
        nodes = snap.nodes.values_list()
        for rollout in found:
            await self._reconcile(rollout, nodes)

    def _report(self, objects: list[Any], problems: dict[str, str]) -> None:
        """An object the controller cannot roll out (a CRD looser than the controller's): said
        once per problem in the log and as a Warning Event on it, counted in a gauge; its
        status is left as it is and the other objects go on."""
        for name, why in problems.items():
            if self._invalid.get(name) == why:
                continue
            log.warning("NodeAgentConfig not rolled out: invalid", object=name, error=why)
            obj = next((o for o in objects if (o.get("metadata") or {}).get("name") == name), None)
            if isinstance(obj, dict):
                self._record(obj, Event("Warning", "RolloutInvalid", why))
        self._invalid = dict(problems)
        metrics.INVALID.set(len(problems))

    def _record(self, obj: dict[str, Any], event: Event) -> None:
        about = Involved.of(NODEAGENTCONFIGS, obj)
        self.recorder.record(event.type, event.reason, event.message, about=about)

    def _forget(self, name: str) -> None:
        self._phases.pop(name, None)
        self._last_write.pop(name, None)
        self._wake_at.pop(name, None)
        for labels in [(name, str(phase)) for phase in Phase] + [(name,)]:
            for gauge in (metrics.PHASE, metrics.ADMITTED, metrics.TARGETED):
                # KeyError: never shown; ValueError: not this gauge's labels.
                with contextlib.suppress(KeyError, ValueError):
                    gauge.remove(*labels)

    async def _reconcile(self, rollout: Rollout, nodes: list[NodeView]) -> None:
        for _attempt in range(CONFLICT_ATTEMPTS):
            now = self._clock()
            planned = plan(rollout.spec, rollout.revision, rollout.nodes, rollout.status, now)
            metrics.PLANS.inc()
            self.plans += 1
            status = planned.status
            self._show(rollout.name, status.phase, status.admitted, status.counts.targeted)
            self._schedule_pause(rollout.name, rollout.spec.pause_seconds, status, now)
            doc = status_document(
                rollout.obj.get("status"), status, rollout.revision.generation, now
            )
            if doc is None:
                return
            last = self._last_write.get(rollout.name)
            clock = trio.current_time()
            if last is not None and clock < last + self.settings.write_interval:
                self._wake_at[rollout.name] = last + self.settings.write_interval
                return  # coalesced into the write after the interval
            if not self.elector.leading:
                return
            body = dict(rollout.obj)
            body["metadata"] = dict(body.get("metadata") or {})
            body["metadata"]["resourceVersion"] = rollout.resource_version
            body["status"] = doc
            try:
                await self.client.update(NODEAGENTCONFIGS, body, subresource="status")
            except Conflict:
                metrics.STATUS_WRITES.labels("conflict").inc()
                metrics.CONFLICTS.inc()
                self.conflicts += 1
                fresh = await self._reread(rollout.name, nodes)
                if fresh is None:
                    return
                rollout = fresh
                continue
            except NotFound:
                return  # deleted meanwhile: the watch says so next
            except KubeError as exc:
                metrics.STATUS_WRITES.labels("failed").inc()
                log.warning("rollout status not written", object=rollout.name, error=str(exc))
                self._wake_at[rollout.name] = trio.current_time() + self.settings.retry_period
                return
            metrics.STATUS_WRITES.labels("ok").inc()
            self.writes += 1
            self._last_write[rollout.name] = trio.current_time()
            for event in planned.events:
                self._record(rollout.obj, event)
            log.info(
                "rollout status written",
                object=rollout.name,
                phase=str(status.phase),
                wave=status.wave,
                admitted=status.admitted,
                events=[e.reason for e in planned.events],
            )
            return

    async def _reread(self, name: str, nodes: list[NodeView]) -> Rollout | None:
        """The object as it is now (after a 409), observed with the same nodes."""
        try:
            obj = msgspec.json.decode(await self.client.get(NODEAGENTCONFIGS, name))
        except KubeError as exc:
            log.warning("rollout object not read again", object=name, error=str(exc))
            return None
        # Targeting depends on every object; the others are as the watch shows them.
        found = [r for r in rollouts([obj], nodes) if r.name == name]
        return found[0] if found else None

    def _schedule_pause(self, name: str, pause: int, status: RolloutStatus, now: float) -> None:
        """A wake-up when the pause after a finished wave ends (the plan opens the next wave
        only once ``now`` passed it)."""
        if pause <= 0 or not status.wave_complete_at or status.phase != Phase.PROGRESSING:
            return
        ends = _parse_stamp(status.wave_complete_at) + pause
        if ends > now:
            # The stamp has whole seconds: a hair later, so the plan sees the pause over.
            at = trio.current_time() + (ends - now) + 0.01
            self._wake_at[name] = min(self._wake_at.get(name, math.inf), at)

    def _show(self, name: str, phase: Phase, admitted: int, targeted: int) -> None:
        if self._phases.get(name) != phase:
            for each in Phase:
                metrics.PHASE.labels(name, str(each)).set(1 if each == phase else 0)
            self._phases[name] = phase
        metrics.ADMITTED.labels(name).set(admitted)
        metrics.TARGETED.labels(name).set(targeted)


async def main(settings: ControllerSettings, client: KubeClient) -> None:
    """The process: the controller and, if an address is set, /metrics and /healthz, until
    SIGTERM or SIGINT (then the Lease is released on the way out)."""
    from nodeagent.rollout_controller.endpoint import serve

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with client:
            controller = Controller(client, settings)
            async with trio.open_nursery() as nursery:
                if settings.metrics_address:
                    await nursery.start(serve, settings.metrics_address, lambda: controller.alive)
                nursery.start_soon(controller.run)
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
