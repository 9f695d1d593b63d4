"""An agent restart with unchanged reporter plugins writes nothing to the CNR, every time (issue
21 s5): three reporter plugins (the SDK, each in its own process, staying up across the restarts;
one of them sends a field the merge skips), a label of another manager on the CNR, and the agent
restarted (SIGTERM, start again on the same state dir) three times. The apiserver's own request
counter counts the writes; its audit log names them (verb, user, time after the SIGTERM) when
there are any; the agents' write metrics say which verb and which agent.

The plugins start after the first agent created the CNR, so their reports are held by
cnr_min_write_interval: /v1/cnr must not say synced before the held write is on the server (it
did; on a loaded CI machine the baseline was then taken early, the first agent was stopped with
the write still held, and the restarted agent wrote apply + status).

The system reporter is off: it reads this VM's MemTotal, which moves (memory ballooning), and a
changed report is rightly written."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from functools import partial
from typing import Any

import pytest
import trio

from nodeagent.kube import errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_katalyst_plugin import apiserver_cnr_writes, cnr_view
from tests.process.test_process_resourceslices import metric_sum
from tests.support.apiserver import ApiServer
from tests.support.audit import audit_events, start_audited_apiserver
from tests.support.crds import CNR, install_cnr_crd, install_cnr_node_access
from tests.support.wait import until

NODE = "node-w"
FOREIGN_LABEL = "ops.example.com/rack"

# Every request on CustomNodeResources, at Metadata level: which verb, by whom and when, so
# that a write the counter finds is named in the failure.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources: [{group: node.katalyst.kubewharf.io, resources: [customnoderesources]}]
- level: None
"""


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = start_audited_apiserver(tmp_path_factory.mktemp("apiserver"), AUDIT_POLICY, (NODE,))
    try:
        yield srv
    finally:
        srv.close()


def cnr_writes_audited(apiserver: ApiServer, since: float) -> list[str]:
    """The CNR writes the apiserver received since ``since`` (time.time()): seconds after it,
    verb, subresource, user agent, user, response code."""
    out = []
    for received, event in audit_events(apiserver, since):
        if event.get("verb") in ("get", "list", "watch"):
            continue
        ref = event.get("objectRef", {})
        out.append(
            f"+{received - since:.3f}s {event['verb']} {ref.get('subresource', '')} "
            f"ua={event.get('userAgent')} user={event['user'].get('username')} "
            f"code={event.get('responseStatus', {}).get('code')}"
        )
    return out


PLUGIN = """
import sys, trio
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reports import ReportItem

GVK = ("node.katalyst.kubewharf.io", "v1alpha1", "CustomNodeResource")
ITEMS = {
    "zones": [
        ReportItem(*GVK, "Status", "TopologyPolicy", "SingleNUMANodeContainerLevel"),
        ReportItem(*GVK, "Status", "Bogus", 1),  # skipped by the merge, reported
    ],
    "labels": [ReportItem(*GVK, "Metadata", "Labels", {"example.com/pool": "a"})],
    "nic": [
        ReportItem(
            *GVK,
            "Status",
            "TopologyZone",
            [{"type": "NIC", "name": "eth0",
              "resources": {"allocatable": {"example.com/bandwidth": "10G"}}}],
        )
    ],
}

async def main(name, registry_dir):
    async with ReporterPlugin.serve(name=name, registry_dir=registry_dir) as plugin:
        await plugin.report(ITEMS[name])
        await trio.sleep_forever()

trio.run(main, sys.argv[1], sys.argv[2])
"""
NAMES = ("zones", "labels", "nic")


@pytest.fixture
def plugins(registry: str) -> Iterator[Callable[[], None]]:
    """Starts the three plugin processes when called (after the first agent: see the test)."""
    procs: list[subprocess.Popen[str]] = []

    def start() -> None:
        procs.extend(
            subprocess.Popen([sys.executable, "-c", PLUGIN, name, registry], text=True)
            for name in NAMES
        )

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=15)


@pytest.fixture
def cnr_access(apiserver: ApiServer) -> None:
    async def install() -> None:
        async with client_for(apiserver, "admin") as admin, client_for(apiserver, NODE) as node:
            await install_cnr_crd(admin)
            await install_cnr_node_access(admin, node, NODE)
            with suppress(errors.NotFound):
                await admin.delete(CNR, NODE)

    trio.run(install)


def get_cnr(apiserver: ApiServer) -> dict[str, Any] | None:
    status, body = apiserver.request("GET", CNR.path(None, NODE))
    if status == 404:
        return None
    assert status == 200, body
    doc: dict[str, Any] = body
    return doc


def _foreign_label(apiserver: ApiServer) -> None:
    async def label() -> None:
        async with client_for(apiserver, "admin") as admin:
            await admin.patch(
                CNR, NODE, {"metadata": {"labels": {FOREIGN_LABEL: "r1"}}}, type="merge"
            )

    trio.run(label)


def _start(
    start_agent: StartAgent, apiserver: ApiServer, registry: str, *args: str
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        registry,
        "--set",
        "reporter.system_reporter=false",
        "--set",
        "reporter.grace=300",
        # Long enough that the plugins' first reports are held after the create (see the test).
        "--set",
        "reporter.cnr_min_write_interval=5",
        *args,
    )
    agent.wait_ready()
    return agent


def _settled(agent: AgentProcess) -> bool:
    """The three plugins running, their reports merged and the CNR found to hold the merge
    (`synced` is false while newer reports wait, held by cnr_min_write_interval)."""
    view = cnr_view(agent)
    sync = view.get("sync") or {}
    return bool(
        sync.get("synced")
        and set(NAMES) <= set(view.get("plugins") or ())
        and metric_sum(agent, "nodeagent_reporter_plugins", 'state="running"') == len(NAMES)
    )


def _synced(agent: AgentProcess) -> bool:
    """Settled, and synced since the start without writing (a plugin's return publishes and
    wakes the writer, which syncs at once when it has not written; returns before the CNR was
    read are covered by the first sync)."""
    unchanged = metric_sum(agent, "nodeagent_cnr_writes_total", 'result="unchanged"')
    return _settled(agent) and unchanged >= 1


@pytest.mark.usefixtures("cnr_access")
def test_restarts_with_unchanged_plugins_write_nothing(
    apiserver: ApiServer,
    start_agent: StartAgent,
    registry: str,
    plugins: Callable[[], None],
) -> None:
    # The plugins come after the first agent created the CNR: their reports arrive within
    # cnr_min_write_interval of that write and are held. The baseline below must not be taken
    # before the held write (CI, loaded machine: the first agent's /v1/cnr said synced while its
    # reports were held, the restart found the CNR short of them and wrote apply + status).
    first = _start(start_agent, apiserver, registry)
    until(lambda: get_cnr(apiserver) is not None, "the CNR created")
    plugins()
    until(lambda: _settled(first), "the three plugins merged into the CNR", timeout=60)
    # Synced means on the server, not merged and held.
    cnr = get_cnr(apiserver)
    assert cnr is not None
    assert cnr["metadata"].get("labels", {}).get("example.com/pool") == "a", cnr["metadata"]
    status = cnr.get("status") or {}
    assert status.get("topologyPolicy") and status.get("topologyZone"), status
    unchanged = partial(metric_sum, first, "nodeagent_cnr_writes_total", 'result="unchanged"')
    before = unchanged()
    _foreign_label(apiserver)
    # The label's watch event wakes the writer, which finds nothing to write.
    until(
        lambda: unchanged() > before and _settled(first),
        "synced again after the foreign label",
        timeout=60,
    )
    assert cnr_view(first)["sync"]["writes"] >= 2  # created, then the held reports written
    cnr = get_cnr(apiserver)
    assert cnr is not None and cnr["metadata"]["labels"][FOREIGN_LABEL] == "r1"
    agent = first
    for run in range(3):
        writes = apiserver_cnr_writes(apiserver)
        version = cnr["metadata"]["resourceVersion"]
        mark = time.time()
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0
        stopped = time.time() - mark
        agent = _start(start_agent, apiserver, registry, "--state-dir", str(first.state_dir))
        ready = time.time() - mark
        try:
            until(partial(_synced, agent), f"restart {run}: settled and synced", timeout=60)
        except AssertionError as exc:
            # What the agent saw: which plugins, the sync state, the writes by verb and result.
            writes_text = "\n".join(
                line
                for line in agent.get("/metrics")[1].splitlines()
                if line.startswith(("nodeagent_cnr_writes_total", "nodeagent_reporter_plugins"))
            )
            raise AssertionError(f"{exc}\n{cnr_view(agent)}\n{writes_text}") from None
        by_verb = {
            verb: metric_sum(agent, "nodeagent_cnr_writes_total", f'verb="{verb}",result="ok"')
            for verb in ("create", "apply", "status")
        }
        cnr = get_cnr(apiserver)
        assert cnr is not None
        # Every write request since the restart's baseline, named (verb, agent, time) if any.
        assert apiserver_cnr_writes(apiserver) == writes, (
            f"run {run}: agent's ok writes {by_verb}; SIGTERM at +0, exited +{stopped:.3f}s, "
            f"new agent ready +{ready:.3f}s; audited: {cnr_writes_audited(apiserver, mark)}"
        )
        assert cnr["metadata"]["resourceVersion"] == version, run
        assert cnr["metadata"]["labels"][FOREIGN_LABEL] == "r1"
        assert cnr_view(agent)["sync"]["writes"] == 0
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
