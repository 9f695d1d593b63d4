"""The process's watches against the real apiserver (issue 24 s4, s5): the agent's components
watch through the cluster component's one `WatchHub`, so this node's Node, which the publisher
and the dynamic configuration both watch, is watched once; the reachability probe is skipped
while the watches show the apiserver answering; and through a crash-restart of the apiserver the
kube component stays ready (an outage shorter than agent.apiserver_unreachable_bound) while the
watches resume on the new process.

Requests are counted by the agent's own `nodeagent_api_requests_total` (the same counts the load
tool checks against the apiserver's audit log). Real clock where the apiserver's pace decides
(its restart), with generous bounds."""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from nodeagent.accumulator import Accumulator, ObjectMap, Query
from nodeagent.kube import NODES, KubeClient, errors
from nodeagent.kube.metrics import API_REQUESTS
from nodeagent.kube.settings import KubeSettings
from nodeagent.resources.publisher import node_query_args
from nodeagent.service.cluster import ClusterComponent
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer, start_apiserver

NODE = "node-a"


def requests(verb: str, resource: str, *, unanswered: bool = False) -> float:
    """Requests the server answered (any code; ``unanswered``: also those it did not), by verb
    and resource."""
    total = 0.0
    for metric in API_REQUESTS.collect():
        for sample in metric.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_total")
                and labels.get("verb") == verb
                and labels.get("resource") == resource
                and (unanswered or labels.get("code") != "error")
            ):
                total += sample.value
    return total


class Snap:
    def __init__(self) -> None:
        self.node: ObjectMap[Any] = ObjectMap()


def consumers(client: KubeClient) -> tuple[Accumulator, Accumulator]:
    """The publisher's Node query (a Resource, raw bytes) and the dynamic configuration's
    (the kind looked up by discovery, decoded): the same watch request."""
    publisher = Accumulator(client, [Query(**node_query_args(NODE))])
    dynconfig = Accumulator(
        client,
        [Query("node", "v1", "Node", field_selector=f"metadata.name={NODE}", into=dict[str, Any])],
    )
    return publisher, dynconfig


def labels_of(snap: Snap) -> dict[str, str]:
    [node] = snap.node.values_list()
    if isinstance(node, bytes | bytearray):
        node = json.loads(node)
    return dict(node["metadata"].get("labels") or {})


async def until_label(acc: Accumulator, snap: Snap, value: str, limit: float = 30) -> None:
    with trio.fail_after(limit):
        while True:
            acc.update(snap)
            if len(snap.node) == 1 and labels_of(snap).get("nodeagent-test") == value:
                return
            await acc.changed()


async def create_node(admin: KubeClient) -> None:
    with suppress(errors.AlreadyExists):
        await admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


async def label(admin: KubeClient, value: str) -> None:
    await admin.patch(NODES, NODE, {"metadata": {"labels": {"nodeagent-test": value}}})


async def until_watches_live(cluster: ClusterComponent) -> None:
    """The probe's next look finds every watch showing the server (within its interval)."""
    for _ in range(120):
        if "watches live" in cluster.readiness()[1]:
            return
        await trio.sleep(0.5)
    raise AssertionError(f"the watches never showed the server: {cluster.readiness()}")


@asynccontextmanager
async def agent(
    load: Callable[[], KubeClient], probe_interval: float
) -> AsyncIterator[tuple[ClusterComponent, Accumulator, Accumulator]]:
    cluster = ClusterComponent(
        KubeSettings(), load_client=lambda _s: load(), probe_interval=probe_interval
    )
    async with cluster.connected() as client, trio.open_nursery() as nursery:
        assert client is not None
        await nursery.start(cluster.run)
        publisher, dynconfig = consumers(client)
        await nursery.start(publisher.run)
        await nursery.start(dynconfig.run)
        yield cluster, publisher, dynconfig
        nursery.cancel_scope.cancel()


async def test_one_node_watch_for_both_consumers_and_no_probe_while_it_shows_the_server(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    await create_node(admin_client)
    watches0, lists0 = requests("watch", "nodes"), requests("list", "nodes")
    async with agent(lambda: client_for(apiserver, NODE), probe_interval=0.5) as (
        cluster,
        publisher,
        dynconfig,
    ):
        value = uuid.uuid4().hex[:8]
        await label(admin_client, value)
        snaps = Snap(), Snap()
        for acc, snap in zip((publisher, dynconfig), snaps, strict=True):
            await until_label(acc, snap, value)
        assert cluster.watches is not None and cluster.watches.watches == 1
        # Counted from the component's first look that found the watch live: a probe sent
        # before it (the watch still listing) may still be answered after the label is seen.
        await until_watches_live(cluster)
        # The probe (every 0.5 s here) is skipped while the watch shows the server: over 5 s,
        # none, where there would have been about 10.
        probes = requests("get", "readyz")
        await trio.sleep(5)
        assert requests("get", "readyz") == probes
        ready, reason = cluster.readiness()
        assert ready and "watches live" in reason, reason
        # A change still reaches both through the one watch.
        value = uuid.uuid4().hex[:8]
        await label(admin_client, value)
        for acc, snap in zip((publisher, dynconfig), snaps, strict=True):
            await until_label(acc, snap, value)
        # One list and one watch of the Node for both (a streaming list: the watch only).
        assert requests("watch", "nodes") - watches0 == 1
        assert requests("list", "nodes") - lists0 <= 1


async def test_ready_through_an_apiserver_crash_restart_and_the_watches_resume(
    tmp_path: pathlib.Path,
) -> None:
    srv = await trio.to_thread.run_sync(start_apiserver, tmp_path)  # its own: restarted here
    try:
        async with client_for(srv, "admin") as admin:
            await create_node(admin)
            async with agent(lambda: client_for(srv, NODE), probe_interval=5) as (
                cluster,
                publisher,
                dynconfig,
            ):
                snaps = Snap(), Snap()
                for acc, snap in zip((publisher, dynconfig), snaps, strict=True):
                    with trio.fail_after(30):
                        while not acc.update(snap) or len(snap.node) != 1:
                            await acc.changed()
                await until_watches_live(cluster)
                not_ready: list[str] = []
                seen_unreachable = False

                async def watch_readiness() -> None:
                    nonlocal seen_unreachable
                    while True:
                        ready, reason = cluster.readiness()
                        seen_unreachable |= reason.startswith("apiserver unreachable")
                        if not ready:
                            not_ready.append(f"kube: {reason}")
                        for acc in (publisher, dynconfig):
                            if (why := acc.unready_reason()) is not None:
                                not_ready.append(why)
                        await trio.sleep(0.1)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_readiness)
                    srv.kill_apiserver()  # a crash
                    await trio.sleep(3)
                    await trio.to_thread.run_sync(srv.start_apiserver)
                    # The watches resume on the new process: a change made now reaches both.
                    value = uuid.uuid4().hex[:8]
                    await label(admin, value)
                    for acc, snap in zip((publisher, dynconfig), snaps, strict=True):
                        await until_label(acc, snap, value, limit=90)
                    nursery.cancel_scope.cancel()
                assert not_ready == []
                # The outage was seen (the watches could not reconnect: named in the reason
                # without a probe in step with the fleet's), and ready again since, probes
                # skipped again.
                assert seen_unreachable
                await until_watches_live(cluster)
    finally:
        await trio.to_thread.run_sync(srv.close)
