"""Capped exponential backoff: the one retry-delay policy of every retry loop in the agent.

The n-th consecutive failure waits ``initial * factor**(n-1)``, capped at ``maximum``, times a
jitter factor drawn uniformly from ``[jitter.low, jitter.high]`` (the result capped again), so
that clients failing together do not retry together. What differs between the users is only
the parameters:

- kube requests and watches: `Jitter.below(0.5)` (0.2 .. 5 s and 0.5 .. 30 s by default); a
  watch that had listed fine and is refused (403, 429, 5xx) retries with full jitter
  (`Backoff.next_full`);
- plugin streams: the first retry at once, then `Jitter.below(0.5)` (1 .. 180 s);
- plugin registration, as the kubelet's operation executor: no jitter (0.5 .. 122 s);
- component restarts: `Jitter.around(0.2)`, failures counted by the supervisor (0.5 .. 60 s);
- publisher pool syncs, as the upstream workqueue: no jitter, per key (5 ms .. 1000 s).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NO_JITTER", "Backoff", "Jitter"]


@dataclass(frozen=True, slots=True)
class Jitter:
    """Each delay is multiplied by a factor drawn uniformly from ``[low, high]``."""

    low: float = 1.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise ValueError(f"jitter: need 0 < low ({self.low}) <= high ({self.high})")

    @classmethod
    def below(cls, fraction: float) -> Jitter:
        """Up to `fraction` shorter than the base delay, never longer."""
        if not 0 <= fraction < 1:
            raise ValueError(f"jitter: need 0 <= fraction < 1 ({fraction})")
        return cls(1.0 - fraction, 1.0)

    @classmethod
    def around(cls, fraction: float) -> Jitter:
        """Up to `fraction` shorter or longer than the base delay (capped at the maximum)."""
        if not 0 <= fraction < 1:
            raise ValueError(f"jitter: need 0 <= fraction < 1 ({fraction})")
        return cls(1.0 - fraction, 1.0 + fraction)

    def apply(self, base: float, draw: float) -> float:
        """`base` scaled by the factor that `draw` (uniform in [0, 1)) picks."""
        return base * (self.low + (self.high - self.low) * draw)


NO_JITTER = Jitter()


class Backoff:
    """Delays for consecutive failures, counted here (`next`, `reset`) or by the caller
    (`delay(n)`, for one policy shared by several retry loops).

    ``immediate_first``: the first retry runs at once (a one-off failure costs nothing) and the
    growth starts with the second. ``random`` draws the jitter (injectable for tests).
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        factor: float = 2.0,
        jitter: Jitter = NO_JITTER,
        immediate_first: bool = False,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff: need 0 < initial ({initial}) <= maximum ({maximum})")
        if factor < 1:
            raise ValueError(f"backoff: need factor >= 1 ({factor})")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.immediate_first = immediate_first
        self._random = random
        # Consecutive failures counted by `next` (the caller's count when it uses `delay`).
        self.failures = 0

    def base(self, failures: int) -> float:
        """The delay before the retry after failure number `failures` (1-based), un-jittered."""
        try:
            grown = self.initial * self.factor ** (max(failures, 1) - 1)
        except OverflowError:  # thousands of failures: far beyond the cap
            return self.maximum
        return min(self.maximum, grown)

    def delay(self, failures: int) -> float:
        """The jittered delay after failure number `failures` (1-based)."""
        if self.immediate_first:
            if failures <= 1:
                return 0.0
            failures -= 1
        base = self.base(failures)
        if self.jitter.high == self.jitter.low:  # no draw: a shared generator stays untouched
            return min(self.maximum, base * self.jitter.low)
        return min(self.maximum, self.jitter.apply(base, self._random()))

    def next(self) -> float:
        """Count one more failure; the delay before the next attempt."""
        self.failures += 1
        return self.delay(self.failures)

    def next_full(self) -> float:
        """Count one more failure; the delay before the next attempt drawn uniformly from
        [0, its un-jittered value] ("full jitter"): clients refused in the same instant retry
        spread over the whole step, not only over its jittered part."""
        self.failures += 1
        return self.base(self.failures) * self._random()

    def reset(self) -> None:
        """A success: the next failure starts from the beginning again."""
        self.failures = 0
