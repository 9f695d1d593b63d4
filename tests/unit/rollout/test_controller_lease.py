"""Leader election through the Lease, with Trio's autojump clock and an in-memory Lease store
that checks resourceVersions as the apiserver does: one leader at a time, a leader that cannot
renew stops leading within renewDeadline, a follower takes over only after leaseDuration of an
unchanged record, and a stopping leader hands over at once (it releases the Lease)."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import trio
import trio.testing

from nodeagent.kube import Conflict, KubeClient, KubeError, NotFound
from nodeagent.rollout_controller.lease import LeaseElector
from tests.support.wait import wait_until

DURATION, DEADLINE, RETRY = 15.0, 10.0, 2.0


class Server:
    """One Lease, stored as the apiserver would (resourceVersion precondition on update)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.holders: list[str] = []  # holderIdentity after each write


class Client:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.down = False  # every request fails (a partitioned leader)

    def _check(self) -> None:
        if self.down:
            raise KubeError("connection refused")

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> bytes:
        self._check()
        if self.server.lease is None:
            raise NotFound(404, "NotFound", "no lease")
        return msgspec.json.encode(self.server.lease)

    def _store(self, obj: dict[str, Any]) -> bytes:
        self.server.version += 1
        obj = msgspec.json.decode(msgspec.json.encode(obj))
        obj["metadata"]["resourceVersion"] = str(self.server.version)
        self.server.lease = obj
        self.server.holders.append(obj["spec"].get("holderIdentity") or "")
        return msgspec.json.encode(obj)

    async def create(
        self, resource: Any, obj: dict[str, Any], namespace: str | None = None
    ) -> bytes:
        self._check()
        if self.server.lease is not None:
            raise KubeError("409 AlreadyExists")  # an ApiError in life; any failure is a miss
        return self._store(obj)

    async def update(
        self, resource: Any, obj: dict[str, Any], namespace: str | None = None
    ) -> bytes:
        self._check()
        assert self.server.lease is not None
        if obj["metadata"]["resourceVersion"] != self.server.lease["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        return self._store(obj)


def elector(server: Server, identity: str) -> tuple[LeaseElector, Client]:
    client = Client(server)
    made = LeaseElector(
        cast(KubeClient, client),
        "ns",
        "lease",
        identity,
        lease_duration=DURATION,
        renew_deadline=DEADLINE,
        retry_period=RETRY,
    )
    return made, client


async def test_one_leader_at_a_time_and_it_keeps_the_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = Server()
    one, _ = elector(server, "one")
    two, _ = elector(server, "two")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.run)
        nursery.start_soon(two.run)
        for _ in range(100):  # 100 renewals
            await trio.sleep(RETRY)
            assert one.leading + two.leading == 1
        nursery.cancel_scope.cancel()
    assert one.transitions + two.transitions == 1


async def test_a_leader_that_cannot_renew_stops_before_a_follower_takes_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = Server()
    one, one_client = elector(server, "one")
    two, _ = elector(server, "two")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.run)
        await trio.sleep(RETRY / 2)
        assert one.leading
        nursery.start_soon(two.run)
        await trio.sleep(RETRY * 3)
        one_client.down = True
        cut = trio.current_time()
        lost = took = None
        while lost is None or took is None:
            await trio.sleep(0.1)
            assert not (one.leading and two.leading)
            if lost is None and not one.leading:
                lost = trio.current_time() - cut
            if took is None and two.leading:
                took = trio.current_time() - cut
        # One stops writing within renewDeadline of its last renewal; two takes over only
        # once the record stood unchanged for leaseDuration, after one stopped.
        assert lost <= DEADLINE + 0.2
        assert DURATION - RETRY <= took <= DURATION + 2 * RETRY + 0.2
        assert lost < took
        nursery.cancel_scope.cancel()
    # one, renewing; then two (and, as it stopped, its release).
    assert server.holders[0] == "one" and "two" in server.holders
    assert "one" not in server.holders[server.holders.index("two") :]


async def test_a_stopping_leader_releases_the_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = Server()
    one, _ = elector(server, "one")
    two, _ = elector(server, "two")
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run_one() -> None:
            with scope:
                await one.run()

        nursery.start_soon(run_one)
        await trio.sleep(RETRY / 2)
        nursery.start_soon(two.run)
        await trio.sleep(RETRY * 2)
        scope.cancel()
        stopped = trio.current_time()
        await wait_until(lambda: two.leading, "two leading", interval=0.1)
        # At its next try, not after leaseDuration.
        assert trio.current_time() - stopped <= RETRY + 0.2
        assert not one.leading
        nursery.cancel_scope.cancel()
    assert "" in server.holders  # the release
