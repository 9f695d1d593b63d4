"""The small interface every supervised part of the agent implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import trio

# (ready, reason): reason says why not, or what "ready" means here (e.g. standalone).
Readiness = tuple[bool, str]


class Component(Protocol):
    """Long-running part of the agent. `run` calls `task_status.started()` once it serves, then
    runs until cancelled; raising means "restart me" (unless it raises `FatalError`)."""

    @property
    def name(self) -> str: ...

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None: ...


@runtime_checkable
class HasReadiness(Protocol):
    def readiness(self) -> Readiness: ...


class FatalError(Exception):
    """Raised by a component (or the process) for a condition a restart cannot fix: the process
    exits non-zero with this message."""


def readiness_of(component: object) -> Readiness:
    """The component's own readiness; components without a `readiness()` are ready while running."""
    if not isinstance(component, HasReadiness):
        return True, "running"
    try:
        ready, reason = component.readiness()
    except Exception as exc:
        return False, f"readiness check failed: {exc!r}"
    return bool(ready), str(reason)
