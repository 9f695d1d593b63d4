"""Jittered, capped exponential backoff for component restarts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    initial: float
    maximum: float
    multiplier: float = 2.0
    # +-jitter fraction: restarts of many agents after a shared outage do not line up.
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)

    def base(self, failures: int) -> float:
        """The un-jittered delay before restart number `failures` (1-based)."""
        exponent = max(failures, 1) - 1
        # Cap the exponent first: 2.0 ** 2000 overflows a float.
        if exponent > 64:
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def delay(self, failures: int) -> float:
        base = self.base(failures)
        jittered = base * (1.0 + self.rng.uniform(-self.jitter, self.jitter))
        return min(self.maximum, max(0.0, jittered))
