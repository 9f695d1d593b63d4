"""A client-side token bucket shared by every request of one client."""

from __future__ import annotations

import trio


class TokenBucket:
    """``qps`` tokens per second, at most ``burst`` saved up.

    Each caller reserves a token at once (the balance may go negative) and sleeps until its
    token would have accrued, so waiters are served in arrival order without a lock and a
    cancelled waiter's token is given back.
    """

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0:
            raise ValueError(f"qps: {qps}: must be > 0")
        if burst < 1:
            raise ValueError(f"burst: {burst}: must be >= 1")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last: float | None = None

    def _refill(self, now: float) -> None:
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    def reserve(self) -> float:
        """Take one token; return how long the caller must wait before using it."""
        self._refill(trio.current_time())
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> float:
        """Wait for a token; return the time waited."""
        delay = self.reserve()
        if delay > 0:
            try:
                await trio.sleep(delay)
            except BaseException:
                self._tokens += 1.0
                raise
        else:
            await trio.lowlevel.checkpoint()
        return delay
