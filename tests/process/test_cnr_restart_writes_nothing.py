"""An agent restart with unchanged reporter plugins writes nothing to the CNR, every time (issue
21 s5): three reporter plugins (the SDK, each in its own process, staying up across the restarts;
one of them sends a field the merge skips), a label of another manager on the CNR, and the agent
restarted (SIGTERM, start again on the same state dir) three times. The apiserver's own request
counter counts the writes; the agents' write metrics say which verb and which agent.

The system reporter is off: it reads this VM's MemTotal, which moves (memory ballooning), and a
changed report is rightly written."""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from functools import partial
from typing import Any

import pytest
import trio

from nodeagent.kube import errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_katalyst_plugin import apiserver_cnr_writes, cnr_view
from tests.process.test_process_resourceslices import metric_sum, until
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.crds import CNR, install_cnr_crd, install_cnr_node_access

apiserver = apiserver_fixture(scope="module", nodes=("node-w",))

NODE = "node-w"
FOREIGN_LABEL = "ops.example.com/rack"

PLUGIN = """
import sys, trio
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reporter import ReportItem

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
def registry() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="na-cnrw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugins(registry: pathlib.Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", PLUGIN, name, str(registry)], text=True)
        for name in NAMES
    ]
    yield procs
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
    start_agent: StartAgent, apiserver: ApiServer, registry: pathlib.Path, *args: str
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        str(registry),
        "--set",
        "reporter.system_reporter=false",
        "--set",
        "reporter.grace=300",
        *args,
    )
    agent.wait_ready()
    return agent


def _settled(agent: AgentProcess) -> bool:
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


@pytest.mark.usefixtures("cnr_access", "plugins")
def test_restarts_with_unchanged_plugins_write_nothing(
    apiserver: ApiServer, start_agent: StartAgent, registry: pathlib.Path
) -> None:
    first = _start(start_agent, apiserver, registry)
    until(lambda: _settled(first), "the three plugins merged into the CNR", timeout=60)
    _foreign_label(apiserver)
    until(lambda: _settled(first), "synced again after the foreign label", timeout=60)
    cnr = get_cnr(apiserver)
    assert cnr is not None and cnr["metadata"]["labels"][FOREIGN_LABEL] == "r1"
    agent = first
    for run in range(3):
        writes = apiserver_cnr_writes(apiserver)
        version = cnr["metadata"]["resourceVersion"]
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0
        agent = _start(start_agent, apiserver, registry, "--state-dir", str(first.state_dir))
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
        assert apiserver_cnr_writes(apiserver) == writes, (run, by_verb, cnr["metadata"])
        assert cnr["metadata"]["resourceVersion"] == version, run
        assert cnr["metadata"]["labels"][FOREIGN_LABEL] == "r1"
        assert cnr_view(agent)["sync"]["writes"] == 0
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
