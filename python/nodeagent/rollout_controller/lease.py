"""Leader election through a coordination.k8s.io/v1 Lease, with client-go's leaderelection
semantics (k8s.io/client-go/tools/leaderelection):

- a candidate takes a Lease that is free (no holder) or whose record it has seen unchanged for
  ``lease_duration`` by its own clock (no clock comparison with the holder's timestamps);
- the holder renews every ``retry_period``; one that could not renew for ``renew_deadline``
  is no longer the leader (it stops writing before any follower may take over, as
  lease_duration > renew_deadline);
- every write is an update with the resourceVersion read (two candidates: one wins, the other
  gets 409);
- a leader that stops releases the Lease (client-go's ReleaseOnCancel), so its successor takes
  over at once rather than after lease_duration.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from nodeagent.kube import LEASES, ApiError, Conflict, KubeClient, KubeError, NotFound
from nodeagent.log import get_logger
from nodeagent.rollout_controller import metrics

log = get_logger(__name__)

__all__ = ["LeaseElector"]


def _micro_time(wall: float) -> str:
    """metav1.MicroTime."""
    whole = math.floor(wall)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        + f".{int((wall - whole) * 1e6):06d}Z"
    )


class LeaseElector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_change = on_change
        self._clock = clock
        self._holding = False
        self._renewed = -math.inf  # Trio clock of the last successful acquire or renew
        self._observed: tuple[Any, ...] | None = None  # the other holder's record, as last read
        self._observed_at = -math.inf
        self.transitions = 0  # times this candidate became the leader (for tests)

    @property
    def leading(self) -> bool:
        """Holds the Lease, renewed less than renew_deadline ago by its own clock: may write."""
        return self._holding and trio.current_time() - self._renewed < self.renew_deadline

    def _set_holding(self, holding: bool) -> None:
        if holding != self._holding:
            self._holding = holding
            if holding:
                self.transitions += 1
            log.info(
                "leadership " + ("acquired" if holding else "lost"),
                lease=f"{self.namespace}/{self.name}",
                identity=self.identity,
            )
            if self._on_change is not None:
                self._on_change()
        metrics.LEADER.set(1 if self.leading else 0)

    async def run(self) -> None:
        """Tries to acquire, then renews, every retry_period until cancelled; releases the
        Lease on the way out if it holds it."""
        try:
            while True:
                ok = False
                # One attempt may not outlast the deadline (a hung request must not keep a
                # stale leader believing it leads: `leading` also checks the clock).
                with trio.move_on_after(self.renew_deadline):
                    ok = await self._try()
                now = trio.current_time()
                if ok:
                    self._renewed = now
                    self._set_holding(True)
                elif self._holding and now - self._renewed >= self.renew_deadline:
                    log.warning("lease not renewed within renewDeadline: stepping down")
                    self._set_holding(False)
                else:
                    metrics.LEADER.set(1 if self.leading else 0)
                await trio.sleep(self.retry_period)
        finally:
            if self._holding:
                with trio.CancelScope(shield=True), trio.move_on_after(self.retry_period):
                    await self._release()
                self._set_holding(False)

    async def _try(self) -> bool:
        """One acquire-or-renew: True if this candidate holds the Lease now."""
        now = trio.current_time()
        wall = self._clock()
        try:
            lease = msgspec.json.decode(await self.client.get(LEASES, self.name, self.namespace))
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(wall, acquired=_micro_time(wall), transitions=0),
            }
            try:
                await self.client.create(LEASES, body, self.namespace)
            except ApiError as exc:
                if exc.code != 409:  # 409: AlreadyExists, another candidate created it first
                    log.warning("lease not created", error=str(exc))
                return False
            except KubeError as exc:
                log.warning("lease not created", error=str(exc))
                return False
            return True
        except KubeError as exc:
            log.warning("lease not read", error=str(exc))
            return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if holder and holder != self.identity and now < self._observed_at + self.lease_duration:
            return False  # another holder's lease, still current by our clock
        mine = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = spec.get("acquireTime") if mine else _micro_time(wall)
        lease["spec"] = self._spec(wall, acquired=acquired, transitions=transitions)
        try:
            await self.client.update(LEASES, lease, self.namespace)
        except Conflict:
            return False
        except KubeError as exc:
            log.warning("lease not renewed", error=str(exc))
            return False
        return True

    def _spec(self, wall: float, *, acquired: Any, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": acquired,
            "renewTime": _micro_time(wall),
            "leaseTransitions": transitions,
        }

    async def _release(self) -> None:
        """As client-go's release: the holder's name removed and a 1-second duration, so the
        next candidate takes over at its next try."""
        try:
            lease = msgspec.json.decode(await self.client.get(LEASES, self.name, self.namespace))
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            wall = self._clock()
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time(wall))
            lease["spec"] = spec
            await self.client.update(LEASES, lease, self.namespace)
        except KubeError as exc:
            log.warning("lease not released", error=str(exc))
