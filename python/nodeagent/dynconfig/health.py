"""Whether a config on trial hurts the agent: "unhealthy because ..." from the supervisor's
reports (a component crash-looping or not ready past a bound) and the watchdog's age.

A signal is held against the config only if the config could cause it (issue 29 item 2: a
plugin's dead socket or an apiserver outage rolled back a config that touched neither): the
settings its component reads changed on this trial (`CAUSES`, the table documented in
docs/architecture/dynamic-config.md). The rest are reported (log, metric, /v1/config), not
held against it."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.dynconfig.metrics import NOT_BLAMED
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.log import get_logger

__all__ = ["CAUSES", "ComponentHealth", "HealthTracker", "can_cause"]

log = get_logger(__name__)

# The config tables whose change can make a component unhealthy, by component: the tables it
# reads. resources and reporter publish what the plugins stream (plugins.stream_min_interval
# paces it); kube (the apiserver's reachability) and dynconfig (the Node's status writes) read
# only static tables, so no remote config or reload can cause their signals. A component not
# listed, and the watchdog (the event loop is every component's), can be hurt by any change.
CAUSES: Mapping[str, frozenset[str]] = {
    "plugins": frozenset({"plugins"}),
    "resources": frozenset({"resources", "plugins"}),
    "reporter": frozenset({"reporter", "plugins"}),
    "kube": frozenset(),
    "dynconfig": frozenset(),
}


def can_cause(component: str | None, changed: Collection[str] | None) -> bool:
    """Whether a change of the fields `changed` (dotted paths; None: not known, a trial
    resumed from an older checkpoint) can make `component` (None: the watchdog) unhealthy."""
    if changed is None:
        return True
    tables = {path.partition(".")[0] for path in changed}
    causes = CAUSES.get(component) if component is not None else None
    return bool(tables) if causes is None else not causes.isdisjoint(tables)


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
    # The fields the trial changed (None: not known, every signal counts).
    _changed: frozenset[str] | None = None
    # Signals past their bound that the trial's change cannot cause: component -> why.
    not_blamed: dict[str, str] = field(default_factory=dict)

    def start(
        self, reports: Sequence[ComponentHealth], changed: Collection[str] | None = None
    ) -> None:
        """A trial of a change of `changed` begins: restarts are counted from here, readiness
        timed afresh."""
        self._unready_since.clear()
        self._restarts_at_start = {r.name: r.restarts for r in reports}
        self._changed = None if changed is None else frozenset(changed)
        self.not_blamed.clear()

    def observe(
        self, reports: Sequence[ComponentHealth], now: float, watchdog_age: float | None = None
    ) -> str | None:
        """Why the config on trial is unhealthy (None: it is not, as far as it can tell)."""
        for report in reports:
            problem = self._problem(report, now)
            if problem is None:
                self.not_blamed.pop(report.name, None)
            elif can_cause(report.name, self._changed):
                return problem
            else:
                if report.name not in self.not_blamed:
                    NOT_BLAMED.labels(report.name).inc()
                    log.warning(
                        "dynconfig trial: a signal its change cannot cause, not held against it",
                        component=report.name,
                        reason=problem,
                        changed=",".join(sorted(self._changed or ())),
                    )
                self.not_blamed[report.name] = problem
        bound = self.settings.watchdog_bound
        if watchdog_age is not None and watchdog_age > bound and can_cause(None, self._changed):
            return f"watchdog not kicked for {watchdog_age:.0f}s (bound {bound:g}s)"
        return None

    def _problem(self, report: ComponentHealth, now: float) -> str | None:
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
            return None
        since = self._unready_since.setdefault(report.name, now)
        if now - since > self.settings.unready_bound:
            return (
                f"component {report.name} not ready for {now - since:.0f}s "
                f"(bound {self.settings.unready_bound:g}s): {report.reason}"
            )
        return None
