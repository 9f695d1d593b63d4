"""Backoff policies: per-operation exponential backoff and a jittered backoff for streams."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["ExponentialBackoff", "JitteredBackoff"]


class ExponentialBackoff:
    """The kubelet's per-operation backoff (goroutinemap/exponentialbackoff).

    After a failure at time t the operation may run again at t + duration; the duration starts at
    `initial` and doubles with each further failure, capped at `cap`. Success resets it.
    """

    def __init__(self, initial: float = 0.5, cap: float = 122.0) -> None:
        self.initial = initial
        self.cap = cap
        self.duration = 0.0
        self.last_error_time: float | None = None
        self.failures = 0

    def record_failure(self, now: float) -> None:
        self.duration = self.initial if self.duration == 0 else min(self.duration * 2, self.cap)
        self.last_error_time = now
        self.failures += 1

    def ready_at(self) -> float:
        """The earliest time the operation may run again (-inf when it never failed)."""
        if self.last_error_time is None:
            return float("-inf")
        return self.last_error_time + self.duration

    def reset(self) -> None:
        self.duration = 0.0
        self.last_error_time = None
        self.failures = 0


class JitteredBackoff:
    """Delays for restarting a stream, as the seed kubelet's plugin streams retried: the first
    retry at once (a one-off failure costs nothing), then doubling from `initial` up to `cap`,
    each drawn uniformly from the upper half of its step so that many plugins failing together
    do not retry in step."""

    def __init__(
        self,
        initial: float = 1.0,
        cap: float = 180.0,
        *,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        self.initial = initial
        self.cap = cap
        self.attempts = 0
        self._random = random_fraction

    def next_delay(self) -> float:
        self.attempts += 1
        if self.attempts == 1:
            return 0.0
        step = min(self.initial * 2 ** min(self.attempts - 2, 62), self.cap)
        return float(step / 2 + self._random() * step / 2)

    def reset(self) -> None:
        self.attempts = 0
