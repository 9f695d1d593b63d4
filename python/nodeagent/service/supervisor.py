"""Runs components under one nursery and restarts the ones that fail, with jittered backoff."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.core.component import Component, FatalError, Readiness, readiness_of
from nodeagent.log import get_logger
from nodeagent.service.metrics import COMPONENT_READY, COMPONENT_RESTARTS

log = get_logger(__name__)


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"


@dataclass(slots=True)
class ComponentState:
    name: str
    phase: Phase = Phase.STARTING
    restarts: int = 0
    last_error: str | None = None
    restart_at: float | None = None
    running_since: float | None = None


@dataclass(frozen=True, slots=True)
class ComponentReport:
    name: str
    ready: bool
    reason: str
    phase: str
    restarts: int
    last_error: str | None
    restart_in: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ready": self.ready,
            "reason": self.reason,
            "phase": self.phase,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "restart_in": None if self.restart_in is None else round(self.restart_in, 3),
        }


def describe(exc: BaseException) -> str:
    """One line for an error, looking through the single-exception groups nurseries wrap."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def find_fatal(exc: BaseException) -> FatalError | None:
    if isinstance(exc, FatalError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_fatal(inner)
            if found is not None:
                return found
    return None


class Supervisor:
    """Runs each component in its own task and restarts the ones that fail, forever.

    A component's `run` is started with `nursery.start`: it counts as running once it calls
    `task_status.started()`. A failure (an exception or a return) is logged, counted and shown
    in readiness, then the component restarts after a jittered, capped exponential backoff;
    a run that lasted `reset_after` seconds starts the backoff over. `FatalError` is the one
    exception that is not absorbed: it ends the supervisor, and with it the agent. `run()`
    reports started once every component has started or failed its first start, so one broken
    component cannot hold the agent's start-up hostage. `report()` is readiness per component.
    """

    def __init__(
        self,
        components: Sequence[Component],
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 60.0,
        reset_after: float = 120.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique: {names}")
        self.components = list(components)
        self.states = {c.name: ComponentState(c.name) for c in components}
        # +-jitter: restarts of many agents after a shared outage do not line up.
        self._backoff = Backoff(
            backoff_initial,
            backoff_max,
            jitter=Jitter.around(jitter),
            random=(rng or random.Random()).random,
        )
        self._reset_after = reset_after
        for name in names:
            COMPONENT_READY.labels(component=name).set(0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Starts every component; `started()` once each one started or failed its first start, so
        one broken component cannot hold the whole agent's start-up hostage."""
        async with trio.open_nursery() as nursery:
            for component in self.components:
                await nursery.start(self._supervise, component)
            task_status.started()

    async def _supervise(self, component: Component, *, task_status: trio.TaskStatus[None]) -> None:
        state = self.states[component.name]
        announced = False
        failures = 0
        while True:
            state.phase = Phase.STARTING
            started_at = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self._run_component, component)
                    state.phase = Phase.RUNNING
                    state.running_since = trio.current_time()
                    state.restart_at = None
                    if state.restarts:
                        log.info("component recovered", component=component.name)
                    if not announced:
                        announced = True
                        task_status.started()
                error = "exited unexpectedly"
            except Exception as exc:
                fatal = find_fatal(exc)
                if fatal is not None:
                    raise fatal from exc
                error = describe(exc)
            if trio.current_time() - started_at >= self._reset_after:
                failures = 0
            failures += 1
            delay = self._backoff.delay(failures)
            state.phase = Phase.BACKOFF
            state.last_error = error
            state.restarts += 1
            state.running_since = None
            state.restart_at = trio.current_time() + delay
            COMPONENT_RESTARTS.labels(component=component.name).inc()
            COMPONENT_READY.labels(component=component.name).set(0)
            log.error(
                "component failed; restarting",
                component=component.name,
                error=error,
                restart_in=round(delay, 3),
                failures=failures,
            )
            if not announced:
                announced = True
                task_status.started()
            await trio.sleep(delay)

    @staticmethod
    async def _run_component(component: Component, *, task_status: trio.TaskStatus[None]) -> None:
        await component.run(task_status=task_status)

    def report(self, now: Callable[[], float] = trio.current_time) -> list[ComponentReport]:
        """Readiness of every component, in start order; also refreshes the ready gauge."""
        out = []
        for component in self.components:
            state = self.states[component.name]
            ready, reason = self._readiness(component, state)
            COMPONENT_READY.labels(component=component.name).set(1 if ready else 0)
            restart_in = None
            if state.phase is Phase.BACKOFF and state.restart_at is not None:
                restart_in = max(0.0, state.restart_at - now())
            out.append(
                ComponentReport(
                    component.name,
                    ready,
                    reason,
                    state.phase.value,
                    state.restarts,
                    state.last_error,
                    restart_in,
                )
            )
        return out

    @staticmethod
    def _readiness(component: Component, state: ComponentState) -> Readiness:
        if state.phase is Phase.STARTING:
            return False, "starting" if state.last_error is None else (
                f"restarting after error: {state.last_error}"
            )
        if state.phase is Phase.BACKOFF:
            return False, f"failed: {state.last_error}"
        return readiness_of(component)
