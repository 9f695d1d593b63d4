"""Issue 20 item 1 on the real kube-apiserver: a ResourceSlice nodeagent does not manage (no
managed-by label: an older install of the driver leaves one) created in the pool a plugin
publishes, at several offsets around the plugin's registration and the publisher's first write
to the pool. The resources component runs as in the agent (its own accumulator, node-a's
credentials); the foreign slice is created by an admin.

Offsets (the registration is the plugin's inventory reaching the publisher, registered):
3 s before (the control: refused before any write), 0.5 s before, at 0 s, during the create
(the admin's create sent after nodeagent's create request left and before the server stored it,
and again after the server stored nodeagent's slice but before the answer reached the
publisher), 0.3 s after, and long after (a pool published for a while).

Whatever the offset: the pool is refused, the cluster ends with the foreign slice alone (nodeagent
deleted its own, or never created it), the component is not ready with the refusal as its reason,
one `ResourceSlicePoolConflict` Warning Event names the foreign slice, and once the foreign slice
is deleted nodeagent publishes the pool (one slice, `resourceSliceCount: 1`) and is ready again.
Before the fix, the in-flight placements left two slices in the pool, each claiming
`resourceSliceCount: 1`, with the component ready."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.accumulator import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import CORE_EVENTS, RESOURCESLICES, EventRecorder, KubeClient
from nodeagent.kube.metrics import WATCH_EVENTS
from nodeagent.resources.component import ResourcesComponent
from nodeagent.resources.settings import ResourcesSettings
from tests.integration.conftest import client_for
from tests.integration.test_resourceslices import (
    DRIVER,
    NODE,
    Plugins,
    admin,
    inventory,
    node_slices,
)
from tests.support.apiserver import ApiServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
__all__ = ["admin"]  # fixture, re-used

LABEL = "app.kubernetes.io/managed-by"
Hook = Callable[[], Awaitable[None]]


def foreign_body() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "older-install-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "theirs"}],
        },
    }


class Timeline:
    """When things happened (monotonic seconds), for the offsets the test reports."""

    def __init__(self) -> None:
        self.registered: float | None = None
        self.create_sent: float | None = None  # nodeagent's first slice create request
        self.create_answered: float | None = None
        self.foreign: float | None = None  # the admin's create answered
        self.foreign_name = ""
        self.foreign_deleted = False
        self.refused: float | None = None  # the foreign slice seen alone in the pool (50 ms polls)
        # nodeagent slice creates answered after the foreign slice was created, before it went
        self.overlapping = 0

    def offsets(self) -> dict[str, float | int | None]:
        def rel(t: float | None, to: float | None) -> float | None:
            return None if t is None or to is None else round(t - to, 3)

        return {
            "creates_after_foreign": self.overlapping,
            "refused_alone_after_foreign": rel(self.refused, self.foreign),
            "foreign_minus_registration": rel(self.foreign, self.registered),
            "foreign_minus_create_sent": rel(self.foreign, self.create_sent),
            "foreign_minus_create_answered": rel(self.foreign, self.create_answered),
        }


def hold_creates(
    client: KubeClient, timeline: Timeline, sent: Hook | None, stored: Hook | None
) -> None:
    """Runs `sent` after nodeagent's first slice create is issued and before the request goes
    out, `stored` after the server answered and before the answer reaches the client's caller
    (the accumulator's read-your-writes and the publisher)."""
    request = client.request

    async def held(method: str, path: str, **kwargs: Any) -> bytes:
        if kwargs.get("verb") != "create" or kwargs.get("resource") != RESOURCESLICES.plural:
            return await request(method, path, **kwargs)
        first = timeline.create_sent is None
        if first:
            timeline.create_sent = time.monotonic()
            if sent is not None:
                await sent()
        answer = await request(method, path, **kwargs)
        if timeline.foreign is not None and not timeline.foreign_deleted:
            timeline.overlapping += 1
        if first:
            timeline.create_answered = time.monotonic()
            if stored is not None:
                await stored()
        return answer

    client.request = held  # type: ignore[method-assign]


async def conflict_events(admin: KubeClient, name: str) -> list[dict[str, Any]]:
    body = await admin.request(
        "GET",
        CORE_EVENTS.path("default"),
        params={"fieldSelector": "reason=ResourceSlicePoolConflict"},
    )
    items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
    return [e for e in items if name in e["message"]]


# (name, seconds from the foreign slice to the registration or None, where in the create)
CASES = [
    ("3s-before", 3.0, None),
    ("0.5s-before", 0.5, None),
    ("0s", 0.0, None),
    ("during-create-before-stored", None, "sent"),
    ("during-create-after-stored", None, "stored"),
    ("0.3s-after", -0.3, None),
    ("after-published", None, "published"),
]


@pytest.mark.parametrize(("case", "lead", "where"), CASES, ids=[c[0] for c in CASES])
async def test_a_foreign_slice_around_registration_refuses_the_pool(
    apiserver: ApiServer, admin: KubeClient, case: str, lead: float | None, where: str | None
) -> None:
    timeline = Timeline()

    async def create_foreign() -> None:
        answer = await admin.create(RESOURCESLICES, foreign_body())
        timeline.foreign = time.monotonic()
        timeline.foreign_name = msgspec.json.decode(answer)["metadata"]["name"]

    plugins = Plugins()
    async with client_for(apiserver, NODE) as client, trio.open_nursery() as nursery:
        hold_creates(
            client,
            timeline,
            create_foreign if where == "sent" else None,
            create_foreign if where == "stored" else None,
        )
        events = EventRecorder(NODE, client=client)
        comp = ResourcesComponent(
            node_name=NODE,
            inventories=plugins.latest,
            settings=LatestValue(ResourcesSettings(startup_grace=0.0)),
            accumulator_settings=AccumulatorSettings(),
            client=client,
            events=events,
        )
        nursery.start_soon(events.run)
        await nursery.start(comp.run)
        pub = comp.publisher
        assert pub is not None

        async def synced() -> bool:
            return pub.synced

        await wait_until(synced, "the first snapshot")
        if lead is not None and lead >= 0:
            watched = WATCH_EVENTS.labels("resourceslices")._value.get()
            await create_foreign()
            await trio.sleep(lead)
            if case == "3s-before":
                # The control asserts no write at all: the foreign slice must be in the
                # publisher's store by now, which 3 s only nearly always are on a loaded machine.
                async def delivered() -> bool:
                    return WATCH_EVENTS.labels("resourceslices")._value.get() > watched

                await wait_until(delivered, "the foreign slice delivered by the publisher's watch")
        timeline.registered = time.monotonic()
        plugins.send(inventory(3))
        if lead is not None and lead < 0:
            await trio.sleep(-lead)
            await create_foreign()
        if where == "published":

            async def published() -> bool:
                items = await node_slices(admin)
                return len(items) == 1 and pub.pending() == 0 and pub.failing() == {}

            await wait_until(published, "the pool published")
            await create_foreign()

        async def created() -> bool:
            return bool(timeline.foreign_name)

        await wait_until(created, "the foreign slice created")
        name = timeline.foreign_name

        async def refused() -> bool:
            items = await node_slices(admin)
            return [o["metadata"]["name"] for o in items] == [name] and bool(pub.refused())

        await wait_until(refused, "the pool refused, the foreign slice alone in it")
        timeline.refused = time.monotonic()
        ready, reason = comp.readiness()
        assert not ready
        assert f"not managed by nodeagent ({name})" in reason, reason

        async def reported() -> bool:
            return len(await conflict_events(admin, name)) == 1

        await wait_until(reported, "one ResourceSlicePoolConflict Event")
        # Refused stays refused: no slice of nodeagent's comes back while the foreign one stays.
        await trio.sleep(1.5)
        items = await node_slices(admin)
        assert [o["metadata"]["name"] for o in items] == [name]
        assert not comp.readiness()[0]

        if case == "3s-before":
            assert timeline.overlapping == 0, "the pool was refused before any write"
        await admin.delete(RESOURCESLICES, name)
        timeline.foreign_deleted = True

        async def resumed() -> bool:
            items = await node_slices(admin)
            return (
                len(items) == 1
                and items[0]["metadata"]["labels"].get(LABEL) == "nodeagent"
                and items[0]["spec"]["pool"]["resourceSliceCount"] == 1
                and comp.readiness()[0]
            )

        await wait_until(resumed, "the pool published again, the component ready")
        assert pub.refused() == set() and pub.failing() == {}
        print(f"\n{case}: {timeline.offsets()}")  # the timings the report quotes (pytest -s)
        nursery.cancel_scope.cancel()
