"""What became of each pool's syncs, as the operator is told of it: the pools failing (with the
last error, until a sync succeeds), refused (they hold slices nodeagent does not manage),
refused by the API server (422/400: not tried again while the desired state is unchanged) and
stale after a 409 Conflict; and why a sync that wrote nothing waited (`Deferred`).

Each failure is reported once per streak (an Event on the Node and a log line), not once per
retry; a pool recovers when a sync of it succeeds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.kube import ApiError, EventRecorder
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired
from nodeagent.resources.observed import PoolKey

log = get_logger(__name__)

__all__ = ["CONFLICT_STALE_WAIT", "Deferral", "Deferred", "PoolOutcomes"]

# After a 409 Conflict the pool's observed state is stale (every update and delete carries the
# observed resourceVersion, so a retry planned from the same state conflicts again). The retry
# waits, on top of its backoff, until the watch shows a newer state or this many seconds have
# passed (the watch may be down: the fault matrix's reset-mid-response made 8 conflicting writes
# in 0.7 s without this wait).
CONFLICT_STALE_WAIT = 1.0


class Deferral(enum.Enum):
    """Why a sync wrote nothing and must look again later."""

    NOT_SYNCED = "the observed state has not been read yet"
    BUILDING = "the driver's desired slices are being rebuilt"
    STATE_UNKNOWN = "the observed state is not known"
    NO_NODE = "the Node does not exist"
    STALE = "the last write conflicted; waiting for a newer observed state"
    INVALID = "the API server refused this desired state"
    NO_INVENTORY = "the plugin has sent no valid inventory since the start"
    GRACE = "the plugin is gone (or unknown since the start); its grace has not passed"
    TAKEN_OVER_GRACE = "the pool was taken over; the start-up grace has not passed"


@dataclass(frozen=True)
class Deferred:
    """A sync that waited: why, and after how many seconds to look again (None: a change
    of the state waited for queues the pool)."""

    reason: Deferral
    again: float | None = None


class PoolOutcomes:
    """The failure bookkeeping of the pools: one owner for what each sync's outcome changes."""

    def __init__(self, events: EventRecorder | None) -> None:
        self._events = events
        self._failing: dict[PoolKey, str] = {}  # pool -> last error, until a sync succeeds
        self._refused: set[PoolKey] = set()  # failing because of foreign slices
        # Pools whose last write conflicted: the observed versions then, and until when a
        # retry waits for newer ones.
        self._stale: dict[PoolKey, tuple[Mapping[str, str], float]] = {}
        # Pools the API server refused: the desired state refused, and until when an
        # unchanged desired state is not tried again.
        self._invalid: dict[PoolKey, tuple[Desired | None, float]] = {}

    # -- what readiness and /v1/status show -----------------------------------------------

    def failing(self) -> dict[PoolKey, str]:
        return dict(self._failing)

    def refused(self) -> set[PoolKey]:
        return set(self._refused)

    def invalid(self) -> set[PoolKey]:
        return set(self._invalid)

    def stale(self, key: PoolKey) -> bool:
        """Whether a retry of the pool waits for a newer observed state (a failing pool: its
        backoff keeps growing)."""
        return key in self._stale

    # -- before a sync writes ---------------------------------------------------------------

    def held(
        self, key: PoolKey, versions: Mapping[str, str], desired: Desired | None, now: float
    ) -> Deferred | None:
        """Whether a past failure holds the pool back: a conflict until the observed state is
        newer (`versions` differ) or its wait has passed; a refused desired state until it
        changes or `invalid_retry_interval` has passed."""
        stale = self._stale.pop(key, None)
        if stale is not None:
            seen, until = stale
            if versions == seen and now < until:
                # A newer observed state queues the pool at once; else look again at `until`.
                self._stale[key] = stale
                return Deferred(Deferral.STALE, until - now)
        invalid = self._invalid.get(key)
        if invalid is not None:
            refused, until = invalid
            if refused is desired and now < until:
                return Deferred(Deferral.INVALID, until - now)
        return None

    # -- after a sync -----------------------------------------------------------------------

    def succeeded(self, key: PoolKey, deferred: Deferred | None) -> None:
        """The sync raised nothing: the pool has recovered, unless it only waited out a
        conflict or a refusal."""
        if key in self._stale or (deferred is not None and deferred.reason is Deferral.INVALID):
            return
        self._refused.discard(key)
        self._invalid.pop(key, None)
        if self._failing.pop(key, None) is not None:
            log.info("resourceslice pool recovered", driver=key[0], pool=key[1])

    def failed(self, key: PoolKey, result: str, error: str, failures: int) -> None:
        """An API error ("failed") or an unexpected exception ("error"); retried with backoff
        (`failures`: consecutive failures, this one included)."""
        metrics.SYNCS.labels(result).inc()
        self._refused.discard(key)
        if key not in self._failing:
            # Once per failure streak: the operator looks at the Node's events.
            self._warn(
                "ResourceSliceSyncFailed",
                f"publishing pool {key[1]} of driver {key[0]} failed: {error}",
            )
        self._failing[key] = error
        log.warning(
            "resourceslice sync failed; retrying with backoff",
            driver=key[0],
            pool=key[1],
            error=error,
            failures=failures,
        )

    def conflicted(self, key: PoolKey, versions: Mapping[str, str], now: float) -> None:
        """A write conflicted: the observed state `versions` is stale; a retry waits for a
        newer one, or `CONFLICT_STALE_WAIT`."""
        self._stale[key] = (versions, now + CONFLICT_STALE_WAIT)

    def refuse(self, key: PoolKey, error: str) -> None:
        """The pool also holds slices nodeagent does not manage."""
        metrics.SYNCS.labels("refused").inc()
        self._refused.add(key)
        if self._failing.get(key) != error:
            self._warn("ResourceSlicePoolConflict", error)
            log.error("resourceslice pool refused", driver=key[0], pool=key[1], error=error)
        self._failing[key] = error

    def refused_by_server(
        self, key: PoolKey, exc: ApiError, desired: Desired | None, now: float, retry: float
    ) -> Deferred:
        """The API server refuses the pool's `desired` state (422/400): the same request gets
        the same answer, so no backoff loop, but a look again when the inventory changes or
        after `retry` seconds."""
        metrics.SYNCS.labels("invalid").inc()
        self._refused.discard(key)
        self._invalid[key] = (desired, now + retry)
        error = (
            f"the API server refuses pool {key[1]} of driver {key[0]} "
            f"({exc.code} {exc.reason}): {exc.message}"
        )
        if self._failing.get(key) != error:
            self._warn("ResourceSlicePoolInvalid", error)
            log.error(
                "resourceslice pool refused by the API server; tried again when the inventory "
                "changes or after resources.invalid_retry_interval",
                driver=key[0],
                pool=key[1],
                error=error,
                retry_in=retry,
            )
        self._failing[key] = error
        return Deferred(Deferral.INVALID, retry)

    def dropped(self, key: PoolKey, fields: Mapping[str, str]) -> None:
        """One report for the fields (each with its likely feature gate, "" when none is
        known) a sync's writes found dropped by the API server."""
        if not fields:
            return
        driver, pool = key
        what = ", ".join(f"{f} (feature gate {gate or 'unknown'})" for f, gate in fields.items())
        self._warn(
            "ResourceSliceFieldsDropped",
            f"the API server did not store {what} of pool {pool} of driver {driver}: the "
            "gate is off on this cluster; the pool is published without them",
        )
        log.warning(
            "the API server did not store every field sent (a feature gate is off?); planning "
            "against what it stored",
            driver=driver,
            pool=pool,
            fields=sorted(fields),
        )

    def show(self) -> None:
        """The gauges of lasting refusals."""
        metrics.REFUSED_POOLS.set(len(self._refused))
        metrics.INVALID_POOLS.set(len(self._invalid))

    def _warn(self, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.warn(reason, message)
