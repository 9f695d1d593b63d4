"""Bounded health signals: how long each part of the agent's job has been failing, so that a
component turns not ready only when a failure lasts longer than its bound.

A brief control-plane restart (writes refused, watches relisting, the apiserver unreachable for
tens of seconds) must not flip readiness, nor make a dynamic-config trial roll back a good
config; a failure that lasts longer than its bound is the agent not doing its job, and must.
Each component keeps a `Lapses` per signal kind and feeds it what is failing now, whenever its
readiness is asked (every heartbeat through the status loop, every trial health check, every
`/readyz`); the lapse of each failing key runs from the first time it was seen failing, or from
its last success when the component knows one that is newer.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import Gauge

K = TypeVar("K", bound=Hashable)

FAILING_SECONDS = Gauge(
    "nodeagent_health_failing_seconds",
    "How long the longest-failing item of a bounded health signal has been failing (0: none), "
    "by component and signal; past the signal's bound the component is not ready.",
    ["component", "signal"],
)


@dataclass(frozen=True, slots=True)
class Lapse(Generic[K]):
    """One failing item: since when, and why."""

    key: K
    since: float
    error: str

    def seconds(self, now: float) -> float:
        return max(0.0, now - self.since)


class Lapses(Generic[K]):
    """Since when each item of one signal has been failing, as observed."""

    def __init__(self, component: str, signal: str) -> None:
        self.component, self.signal = component, signal
        self._since: dict[K, float] = {}
        FAILING_SECONDS.labels(component, signal).set(0)

    def observe(
        self,
        failing: Mapping[K, str],
        now: float,
        last_ok: Mapping[K, float] | None = None,
        began: Mapping[K, float] | None = None,
    ) -> list[Lapse[K]]:
        """``failing``: what fails now, with why; ``last_ok``: when an item last succeeded, if
        known (an item that succeeded after it was first seen failing has failed only since);
        ``began``: when an item not yet seen failing began to (known from elsewhere, e.g. the
        watches that stopped showing the apiserver), else now. Returns the lapses, the longest
        first, and refreshes the gauge."""
        for key in [k for k in self._since if k not in failing]:
            del self._since[key]
        out: list[Lapse[K]] = []
        for key, error in failing.items():
            start = min(now, began.get(key, now)) if began is not None else now
            since = self._since.setdefault(key, start)
            ok = last_ok.get(key, -math.inf) if last_ok is not None else -math.inf
            if ok > since:
                since = self._since[key] = ok
            out.append(Lapse(key, since, error))
        out.sort(key=lambda lapse: lapse.since)
        FAILING_SECONDS.labels(self.component, self.signal).set(out[0].seconds(now) if out else 0.0)
        return out

    def clear(self) -> None:
        self._since.clear()
        FAILING_SECONDS.labels(self.component, self.signal).set(0)


def overdue(lapses: list[Lapse[K]], now: float, bound: float) -> Lapse[K] | None:
    """The longest lapse if it is longer than ``bound``."""
    if lapses and lapses[0].seconds(now) > bound:
        return lapses[0]
    return None


def describe(what: str, lapse: Lapse[K], now: float, bound: float, more: int = 0) -> str:
    """``<what> for Ns (bound Bs): <error>``, with the count of others failing."""
    others = f" (+{more} more)" if more else ""
    return f"{what} for {lapse.seconds(now):.0f}s (bound {bound:g}s): {lapse.error}{others}"
