"""Jittered exponential backoff."""

from __future__ import annotations

import random


class Backoff:
    """Delays growing ``initial * factor**n`` up to ``maximum``, each scaled down by up to
    ``jitter`` at random, so clients that failed together do not retry together."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff: need 0 < initial ({initial}) <= maximum ({maximum})")
        if factor < 1 or not 0 <= jitter < 1:
            raise ValueError(f"backoff: need factor >= 1 ({factor}) and 0 <= jitter < 1 ({jitter})")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.attempt = 0

    def next(self) -> float:
        """The delay before the next attempt."""
        base = min(self.maximum, self.initial * self.factor**self.attempt)
        if base < self.maximum:
            self.attempt += 1
        return base * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        self.attempt = 0
