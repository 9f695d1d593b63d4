"""`nodeagent run --dry-run` on the real kube-apiserver (issue 25 s3): with node-a's real
credentials and a real SDK device plugin, a dry-run agent persists nothing (the apiserver's
audit log shows every write it sent carried dryRun=All, and no slice exists), does not loop
(its would-be writes and its requests stay put over several expiries of its own view), and
reports the very writes a real agent started from the same state then makes (verbs and
objects, from the audit log). Then the canary use: beside the running real agent, a new
dry-run agent would write nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trio

from nodeagent.kube import NODES, RESOURCESLICES, errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent, nodeagent_command
from tests.process.test_cnr_restart_writes_nothing import PLUGIN as REPORTER_PLUGIN
from tests.process.test_process_resourceslices import (
    DRIVER,
    NODE,
    PLUGIN,
    metric_sum,
    node_slices,
    settled,
)
from tests.support.apiserver import ApiServer
from tests.support.audit import audit_events, start_audited_apiserver
from tests.support.crds import CNR, install_cnr_crd, install_cnr_node_access
from tests.support.wait import NotYet, until

# Every write, at Metadata level: verb, object, user, user agent and the request URI (which
# carries dryRun=All).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
"""
DRY_UA = "nodeagent (dry-run)"
# The accumulator shows an own write for this long before the watch must confirm it: a dry
# run's never is, so its view loses the would-be slice every TTL and the publisher writes it
# again (answered from memory, not sent).
LOCAL_WRITE_TTL = 2.0


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = start_audited_apiserver(tmp_path_factory.mktemp("apiserver"), AUDIT_POLICY, (NODE,))
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def node(apiserver: ApiServer) -> Iterator[None]:
    async def prepare(create: bool) -> None:
        async with client_for(apiserver, "admin") as client:
            if create:
                with suppress(errors.AlreadyExists):
                    await client.create(
                        NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
                    )
            await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")

    trio.run(prepare, True)
    yield
    trio.run(prepare, False)


@pytest.fixture
def plugin(registry: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, registry], stderr=subprocess.PIPE, text=True
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert proc.stderr is not None
    proc.stderr.close()


def audited_writes(apiserver: ApiServer, since: float) -> list[dict[str, Any]]:
    """node-a's writes the apiserver answered since ``since`` (time.time()), oldest first."""
    out = []
    for _, event in audit_events(apiserver, since):
        if event["user"].get("username") != f"system:node:{NODE}":
            continue
        query = parse_qs(urlsplit(event["requestURI"]).query)
        ref = event.get("objectRef", {})
        out.append(
            {
                "verb": event["verb"],
                "resource": ref.get("resource", ""),
                "subresource": ref.get("subresource", ""),
                "namespace": ref.get("namespace", ""),
                "name": ref.get("name", ""),
                "dry_run": query.get("dryRun") == ["All"],
                "user_agent": event.get("userAgent", ""),
                "code": event.get("responseStatus", {}).get("code"),
            }
        )
    return out


def settle(agent: AgentProcess, who: str) -> None:
    """Until the agent's plugin is registered and its pool synced (a minute: the machine is
    shared), else fail with what it shows."""
    try:
        until(lambda: settled(agent), f"{who} to settle", timeout=60)
    except AssertionError as exc:
        views = (agent.get(path)[1] for path in ("/v1/resourceslices", "/v1/writes"))
        raise AssertionError(f"{exc}: {' '.join(views)}") from None


def writes_view(agent: AgentProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(agent.get("/v1/writes")[1])
    return doc


def start(
    start_agent: StartAgent, apiserver: ApiServer, registry: str, *extra: str
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        registry,
        "--set",
        f"accumulator.local_write_ttl={LOCAL_WRITE_TTL}",
        # This VM's MemTotal moves (memory ballooning): a run after another could rightly write
        # a new CNR status the first did not.
        "--set",
        "reporter.system_reporter=false",
        *extra,
    )
    agent.wait_ready()
    return agent


def real_writes(apiserver: ApiServer, since: float) -> list[dict[str, Any]]:
    return [w for w in audited_writes(apiserver, since) if not w["dry_run"]]


# A write as the audit log and as /v1/writes name it: verb, resource, namespace and name (a
# create's generated name differs from run to run: its generateName is compared apart).
def made_key(w: dict[str, Any]) -> tuple[str, str, str, str]:
    return (w["verb"], w["resource"], w["namespace"], "" if w["verb"] == "create" else w["name"])


def reported_key(w: dict[str, Any]) -> tuple[str, str, str, str]:
    obj = w["object"]
    name = "" if w["verb"] == "create" else obj["name"]
    return (w["verb"], w["resource"], obj["namespace"], name)


def test_a_dry_run_persists_nothing_and_reports_what_a_real_agent_then_writes(
    apiserver: ApiServer,
    node: None,
    start_agent: StartAgent,
    registry: str,
    plugin: subprocess.Popen[str],
    tmp_path: Path,
) -> None:
    t0 = time.time()
    dry = start(start_agent, apiserver, registry, "--dry-run")
    settle(dry, "the dry-run agent")
    view = until(
        lambda: v if (v := writes_view(dry))["total"] else NotYet(v),
        "the dry run's would-be slice",
        timeout=60,
    )
    assert view["dry_run"] is True
    # Its view holds what it would have written: the pool is synced, not pending forever.
    assert settled(dry) is not None

    # No loop: over several expiries of the would-be slice from its own view, no new
    # would-be write and no new request on the server.
    sent = audited_writes(apiserver, t0)
    recorded = writes_view(dry)["total"]
    time.sleep(LOCAL_WRITE_TTL * 4)
    assert writes_view(dry)["total"] == recorded
    assert audited_writes(apiserver, t0) == sent
    # Its readers' view stays the cluster's: no own write shown (none to drop, none refused).
    assert metric_sum(dry, "nodeagent_accumulator_local_writes_total") == 0
    assert metric_sum(dry, "nodeagent_accumulator_malformed_total") == 0

    # Nothing persisted: every write it sent was a dry run, under its own user agent, and the
    # cluster holds no slice of this node.
    assert sent, "the dry run sent no write at all"
    assert all(w["dry_run"] and w["user_agent"] == DRY_UA for w in sent), sent
    assert node_slices(apiserver) == []
    assert metric_sum(dry, "nodeagent_dry_run_writes_total", 'resource="resourceslices"') == sum(
        1 for w in writes_view(dry)["writes"] if w["resource"] == "resourceslices"
    )
    would = writes_view(dry)["writes"]
    (create,) = [w for w in would if w["resource"] == "resourceslices"]
    assert create["verb"] == "create"
    assert create["object"]["apiVersion"] == "resource.k8s.io/v1"
    assert create["object"]["kind"] == "ResourceSlice"
    assert create["object"]["generateName"] == f"{NODE}-{DRIVER}-"
    spec = next(op["value"] for op in create["diff"] if op["path"] == "/spec")
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    # No local state written either (the checkpoint directory is not even created).
    assert not (dry.state_dir / "checkpoints").exists()

    out = subprocess.run(
        nodeagent_command("status", "--ops-address", dry.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "DRY RUN: nothing is written." in out.stdout
    rows = out.stdout[out.stdout.index("TIME  ") :].splitlines()[1:]
    assert any(r.split()[1:3] == ["create", "ResourceSlice"] for r in rows), out.stdout
    dry.signal(signal.SIGTERM)
    assert dry.wait(timeout=15) == 0

    # A real agent started from the same state makes exactly the writes reported.
    t1 = time.time()
    real = start(start_agent, apiserver, registry)
    until(lambda: node_slices(apiserver) or None, "the real agent's slice", timeout=60)
    settle(real, "the real agent")
    until(
        lambda: len(real_writes(apiserver, t1)) >= len(would) or None,
        f"the real agent's {len(would)} writes",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    made = audited_writes(apiserver, t1)
    assert made and not any(w["dry_run"] for w in made), made
    assert Counter(made_key(w) for w in made) == Counter(reported_key(w) for w in would), (
        made,
        would,
    )
    (obj,) = node_slices(apiserver)
    assert obj["metadata"]["generateName"] == create["object"]["generateName"]
    assert obj["spec"] == spec

    # The canary: beside the running real agent, on its node and reading its state (never
    # writing it), a dry-run agent reports what the real one would write if restarted now...
    t2 = time.time()
    canary = start(
        start_agent, apiserver, registry, "--dry-run", "--state-dir", str(real.state_dir)
    )
    settle(canary, "the canary")
    until(
        lambda: metric_sum(canary, "nodeagent_resourceslice_syncs_total", 'result="unchanged"'),
        "the canary to plan the pool",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    reported = writes_view(canary)["writes"]
    # (the pool is published as the real agent left it: no slice write)
    assert [w for w in reported if w["resource"] == "resourceslices"] == [], reported
    canary_sent = [w for w in audited_writes(apiserver, t2) if w["user_agent"] == DRY_UA]
    assert all(w["dry_run"] for w in canary_sent), canary_sent
    for agent in (canary, real):
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0

    # ... and so it does.
    t3 = time.time()
    again = start(start_agent, apiserver, registry, "--state-dir", str(real.state_dir))
    settle(again, "the restarted real agent")
    until(
        lambda: len(real_writes(apiserver, t3)) >= len(reported) or None,
        f"the restarted real agent's {len(reported)} writes",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    assert Counter(made_key(w) for w in real_writes(apiserver, t3)) == Counter(
        reported_key(w) for w in reported
    ), (real_writes(apiserver, t3), reported)
    again.signal(signal.SIGTERM)
    assert again.wait(timeout=15) == 0


@pytest.fixture
def cnr_access(apiserver: ApiServer) -> None:
    async def install() -> None:
        async with client_for(apiserver, "admin") as admin, client_for(apiserver, NODE) as node:
            await install_cnr_crd(admin)
            await install_cnr_node_access(admin, node, NODE)
            with suppress(errors.NotFound):
                await admin.delete(CNR, NODE)

    trio.run(install)


@pytest.fixture
def reporter(registry: str) -> Iterator[None]:
    """A Katalyst reporter plugin (the SDK, its own process) with one report."""
    proc = subprocess.Popen(
        [sys.executable, "-c", REPORTER_PLUGIN, "zones", registry],
        stderr=subprocess.PIPE,
        text=True,
    )
    yield
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert proc.stderr is not None
    proc.stderr.close()


def get_cnr(apiserver: ApiServer) -> dict[str, Any] | None:
    status, body = apiserver.request("GET", CNR.path(None, NODE))
    if status == 404:
        return None
    assert status == 200, body
    doc: dict[str, Any] = body
    return doc


def cnr_writes_ok(agent: AgentProcess) -> float:
    return metric_sum(agent, "nodeagent_cnr_writes_total", 'result="ok"')


@pytest.mark.usefixtures("cnr_access", "node", "reporter")
def test_a_dry_run_cnr_reports_what_a_real_agent_then_writes(
    apiserver: ApiServer, start_agent: StartAgent, registry: str
) -> None:
    """The CNR writer creates the CNR, then applies its status: in a dry run the create
    stores nothing and the server answers the status write NotFound; the dry run works that
    one out on the would-be CNR (marked unchecked) instead of failing and retrying."""
    t0 = time.time()
    dry = start(start_agent, apiserver, registry, "--dry-run")
    until(
        lambda: (
            "zones" in (json.loads(dry.get("/v1/cnr")[1]).get("plugins") or ())
            and cnr_writes_ok(dry) >= 2
        ),
        "the dry run's CNR writes",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    would = writes_view(dry)["writes"]
    cnr = [w for w in would if w["resource"] == "customnoderesources"]
    assert cnr[0]["verb"] == "create", would
    assert [w.get("unchecked", False) for w in cnr] == [False] + [True] * (len(cnr) - 1)
    # No failure, no retry: the writer's error is clear and nothing more is sent.
    assert json.loads(dry.get("/v1/cnr")[1])["sync"]["error"] is None
    sent = audited_writes(apiserver, t0)
    time.sleep(LOCAL_WRITE_TTL * 2)
    assert audited_writes(apiserver, t0) == sent
    assert writes_view(dry)["writes"] == would
    assert all(w["dry_run"] and w["user_agent"] == DRY_UA for w in sent), sent
    assert get_cnr(apiserver) is None
    dry.signal(signal.SIGTERM)
    assert dry.wait(timeout=15) == 0

    t1 = time.time()
    real = start(start_agent, apiserver, registry)
    until(
        lambda: len(real_writes(apiserver, t1)) >= len(would) or None,
        f"the real agent's {len(would)} writes",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    made = real_writes(apiserver, t1)
    assert Counter(made_key(w) for w in made) == Counter(reported_key(w) for w in would), (
        made,
        would,
    )
    stored = get_cnr(apiserver)
    assert stored is not None
    unchecked_status = next(op["value"] for w in cnr for op in w["diff"] if op["path"] == "/status")
    assert stored["status"] == unchecked_status
    real.signal(signal.SIGTERM)
    assert real.wait(timeout=15) == 0


def test_a_dry_run_delete_deletes_nothing_and_a_real_agent_then_makes_it(
    apiserver: ApiServer,
    node: None,
    start_agent: StartAgent,
    registry: str,
    plugin: subprocess.Popen[str],
) -> None:
    """A pool whose plugin is gone, after the start-up grace: the agent deletes its slice. A
    DELETE takes its options from its body (the query's dryRun alone would be ignored and the
    slice deleted for real)."""
    first = start(start_agent, apiserver, registry)
    (obj,) = until(lambda: node_slices(apiserver) or None, "the plugin's slice", timeout=60)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    plugin.send_signal(signal.SIGTERM)
    plugin.wait(10)
    no_grace = ("--set", "resources.startup_grace=0", "--state-dir", str(first.state_dir))

    t0 = time.time()
    dry = start(start_agent, apiserver, registry, "--dry-run", *no_grace)
    (delete,) = until(
        lambda: [w for w in writes_view(dry)["writes"] if w["verb"] == "delete"] or None,
        "the dry run's would-be delete",
        timeout=60,
    )
    assert delete["resource"] == "resourceslices"
    assert delete["object"]["name"] == obj["metadata"]["name"]
    assert {"op": "remove", "path": "/spec"} in delete["diff"]
    time.sleep(LOCAL_WRITE_TTL * 2)
    would = writes_view(dry)["writes"]
    sent = audited_writes(apiserver, t0)
    assert any(w["verb"] == "delete" for w in sent), sent
    assert all(w["dry_run"] and w["user_agent"] == DRY_UA for w in sent), sent
    (still,) = node_slices(apiserver)
    assert still["metadata"]["uid"] == obj["metadata"]["uid"]
    assert still["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    dry.signal(signal.SIGTERM)
    assert dry.wait(timeout=15) == 0

    t1 = time.time()
    real = start(start_agent, apiserver, registry, *no_grace)
    until(lambda: not node_slices(apiserver), "the real agent's delete", timeout=60)
    until(
        lambda: len(real_writes(apiserver, t1)) >= len(would) or None,
        f"the real agent's {len(would)} writes",
        timeout=60,
    )
    time.sleep(LOCAL_WRITE_TTL * 2)
    made = real_writes(apiserver, t1)
    assert Counter(made_key(w) for w in made) == Counter(reported_key(w) for w in would), (
        made,
        would,
    )
    real.signal(signal.SIGTERM)
    assert real.wait(timeout=15) == 0
