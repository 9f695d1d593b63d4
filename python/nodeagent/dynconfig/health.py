"""Whether a config on trial hurts the agent: "unhealthy because ..." from the supervisor's
reports (a component crash-looping or not ready past a bound) and the watchdog's age."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.dynconfig.settings import DynconfigSettings

__all__ = ["ComponentHealth", "HealthTracker"]


class ComponentHealth(Protocol):
    """What the controller reads of the supervisor's ComponentReport."""

    @property
    def name(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def restarts(self) -> int: ...


@dataclass(slots=True)
class HealthTracker:
    """Tells "unhealthy because ..." from the supervisor's reports during a trial."""

    settings: DynconfigSettings
    _unready_since: dict[str, float] = field(default_factory=dict)
    _restarts_at_start: dict[str, int] = field(default_factory=dict)

    def start(self, reports: Sequence[ComponentHealth]) -> None:
        """A trial begins: restarts are counted from here, readiness timed afresh."""
        self._unready_since.clear()
        self._restarts_at_start = {r.name: r.restarts for r in reports}

    def observe(
        self, reports: Sequence[ComponentHealth], now: float, watchdog_age: float | None = None
    ) -> str | None:
        for report in reports:
            restarts = report.restarts - self._restarts_at_start.setdefault(
                report.name, report.restarts
            )
            if restarts >= self.settings.crashloop_restarts:
                return (
                    f"component {report.name} crash-looping: restarted {restarts} times "
                    f"during the trial ({report.reason})"
                )
            if report.ready:
                self._unready_since.pop(report.name, None)
                continue
            since = self._unready_since.setdefault(report.name, now)
            if now - since > self.settings.unready_bound:
                return (
                    f"component {report.name} not ready for {now - since:.0f}s "
                    f"(bound {self.settings.unready_bound:g}s): {report.reason}"
                )
        if watchdog_age is not None and watchdog_age > self.settings.watchdog_bound:
            return (
                f"watchdog not kicked for {watchdog_age:.0f}s "
                f"(bound {self.settings.watchdog_bound:g}s)"
            )
        return None
