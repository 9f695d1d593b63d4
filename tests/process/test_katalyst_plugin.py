"""A Katalyst reporter plugin no one here wrote: built on `github.com/kubewharf/katalyst-api`
(tests/harness/katalystplugin: its `pkg/plugins/skeleton` registration wrapper and its generated
`reporterplugin/v1alpha1` service, used unchanged), against the project's proto, on its own over
real gRPC, and against `nodeagent run` with node-a's credentials and the real kube-apiserver,
whose CustomNodeResource is what the tests assert.

Expected CNRs are computed here from Katalyst's rules (reference katalyst.md 2.4: a reported field
replaces the CNR's, topology zones deduplicated by (type, name) and sorted), with the in-tree
system reporter's fields taken from what the apiserver holds before the plugin comes, not from the
agent's code. Writes are counted by the apiserver itself (`apiserver_request_total`)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import grpc
import pytest
import trio
from google.protobuf import descriptor_pb2

from nodeagent.checkpoint.format import decode as decode_checkpoint_file
from nodeagent.kube import errors
from nodeagent.protos.k8s.apimachinery.pkg.apis.meta.v1 import generated_pb2 as meta
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rp
from nodeagent.reporter.model import PlainReport
from nodeagent.reporter.store import decode_checkpoint
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_process_resourceslices import metric_sum
from tests.support.apiserver import ApiServer
from tests.support.crds import CNR, install_cnr_crd, install_cnr_node_access
from tests.support.katalystplugin import (
    MODULE_DIR,
    NOT_RELOADED,
    KatalystPlugin,
    build_katalystplugin,
    cnr_content,
    field,
)
from tests.support.wait import until

NODE = "node-a"
PLUGIN = "kat-upstream"
RPC_TIMEOUT = 10.0
# reporter.grace of the agents here: short, so the test sees it run out, and long enough that
# the CNR read after the agent saw the plugin stop (a /metrics poll and two requests on a
# loaded machine) comes well within it.
GRACE = 8.0
LABEL = "katalyst.example.com/reporter"

NIC_ZONE = {
    "type": "NIC",
    "name": "eth0",
    "resources": {"allocatable": {"example.com/bandwidth": "10G"}},
    "attributes": [{"name": "pci", "value": "0000:3b:00.0"}],
}
FIRST = cnr_content(
    [
        field("Metadata", "Labels", {LABEL: "v1"}),
        field("Status", "TopologyPolicy", "SingleNUMANodeContainerLevel"),
        field(
            "Status",
            "Resources",
            {
                "allocatable": {"example.com/reclaimed-cpu": "4"},
                "capacity": {"example.com/reclaimed-cpu": "8"},
            },
        ),
        field("Status", "TopologyZone", [NIC_ZONE]),
    ]
)
# An update: the label changes, the resources shrink, the NIC zone is no longer reported.
SECOND = cnr_content(
    [
        field("Metadata", "Labels", {LABEL: "v2"}),
        field("Status", "TopologyPolicy", "SingleNUMANodeContainerLevel"),
        field("Status", "Resources", {"allocatable": {"example.com/reclaimed-cpu": "2"}}),
    ]
)


# --------------------------------------------------------------------------
# the proto: the project's against katalyst-api's own, compiled from the module's files


def _module_dirs() -> dict[str, pathlib.Path]:
    """Module path -> its directory in the Go module cache (filled by the plugin's build)."""
    build_katalystplugin()
    env = dict(os.environ)
    env["PATH"] = "/usr/local/go/bin" + os.pathsep + env.get("PATH", "")
    out = subprocess.run(
        [
            "go",
            "list",
            "-mod=readonly",
            "-m",
            "-f",
            "{{.Path}} {{if .Replace}}{{.Replace.Dir}}{{else}}{{.Dir}}{{end}}",
            "github.com/kubewharf/katalyst-api",
            "github.com/gogo/protobuf",
            "k8s.io/apimachinery",
            "k8s.io/kubelet",
        ],
        cwd=MODULE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dirs = dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
    missing = sorted(path for path, d in dirs.items() if not d.strip())
    assert not missing, f"not in the Go module cache (run {MODULE_DIR}/build.sh): {missing}"
    return {path: pathlib.Path(d) for path, d in dirs.items()}


def _wire_shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What the wire depends on: package, messages (field names, numbers, labels, types),
    enums (names, numbers), services (methods, their types and streaming). Options (gogo's, Go
    packages) and comments are left out: they do not change the wire."""

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
        return {f.name: (f.number, f.label, f.type, f.type_name.lstrip(".")) for f in m.field} | {
            "nested": sorted(n.name for n in m.nested_type)
        }

    return {
        "package": file.package,
        "syntax": file.syntax or "proto2",
        "messages": {m.name: message(m) for m in file.message_type},
        "enums": {e.name: {v.name: v.number for v in e.value} for e in file.enum_type},
        "services": {
            s.name: {
                m.name: (
                    m.input_type.lstrip("."),
                    m.output_type.lstrip("."),
                    m.client_streaming,
                    m.server_streaming,
                )
                for m in s.method
            }
            for s in file.service
        },
    }


def _upstream_descriptors(tmp: pathlib.Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """katalyst-api's reporterplugin api.proto and the kubelet pluginregistration api.proto the
    skeleton serves, with their imports, compiled by protoc from the module cache, by file
    name."""
    dirs = _module_dirs()
    root = tmp / "include"
    links = {
        "github.com/kubewharf/katalyst-api": dirs["github.com/kubewharf/katalyst-api"],
        "github.com/gogo/protobuf": dirs["github.com/gogo/protobuf"],
        "k8s.io/apimachinery": dirs["k8s.io/apimachinery"],
        "k8s.io/kubelet": dirs["k8s.io/kubelet"],  # Katalyst's fork, as the skeleton builds
    }
    for name, target in links.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(target)
    out = tmp / "upstream.pb"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            "github.com/kubewharf/katalyst-api/pkg/protocol/reporterplugin/v1alpha1/api.proto",
            "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return {f.name: f for f in files}


def _ours(module: Any) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(file)
    return file


def test_the_projects_reporter_proto_is_katalyst_apis_on_the_wire(tmp_path: pathlib.Path) -> None:
    upstream = _upstream_descriptors(tmp_path)
    theirs = upstream[
        "github.com/kubewharf/katalyst-api/pkg/protocol/reporterplugin/v1alpha1/api.proto"
    ]
    assert _wire_shape(_ours(rp)) == _wire_shape(theirs)
    # The one apimachinery message the API uses: the same package, name and proto2 fields.
    gvk_theirs = next(
        m
        for m in upstream["k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto"].message_type
        if m.name == "GroupVersionKind"
    )
    ours_meta = _ours(meta)
    gvk_ours = next(m for m in ours_meta.message_type if m.name == "GroupVersionKind")
    assert ours_meta.package == "k8s.io.apimachinery.pkg.apis.meta.v1"
    assert (ours_meta.syntax or "proto2") == "proto2"
    assert [(f.name, f.number, f.label, f.type) for f in gvk_ours.field] == [
        (f.name, f.number, f.label, f.type) for f in gvk_theirs.field
    ]
    # The registration service the skeleton serves on the same socket.
    registration = upstream["k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto"]
    assert _wire_shape(_ours(reg)) == _wire_shape(registration)


# --------------------------------------------------------------------------
# the plugin on its own: what the skeleton advertises and the generated service sends


def _expected_response(content: dict[str, Any]) -> rp.GetReportContentResponse:
    """The message the content file stands for, built here (values as compact JSON)."""
    return rp.GetReportContentResponse(
        content=[
            rp.ReportContent(
                groupVersionKind=meta.GroupVersionKind(**c["groupVersionKind"]),
                field=[
                    rp.ReportField(
                        fieldType=f["fieldType"],
                        fieldName=f["fieldName"],
                        value=json.dumps(f["value"], separators=(",", ":")).encode(),
                    )
                    for f in c["field"]
                ],
            )
            for c in content["content"]
        ]
    )


@pytest.fixture
def plugin_dir(registry: str) -> pathlib.Path:
    """The shared registry directory (tests/conftest.py) as a Path."""
    return pathlib.Path(registry)


def _unary_raw(channel: grpc.Channel, path: str, request: bytes) -> bytes:
    call = channel.unary_unary(path)  # no (de)serializers: the bytes as sent
    reply: bytes = call(request, timeout=RPC_TIMEOUT)
    return reply


def test_upstream_reporter_plugin_registers_and_streams(
    plugin_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    plugin = KatalystPlugin.start(PLUGIN, plugin_dir, FIRST, workdir=tmp_path)
    try:
        # One socket, <dir>/<name>.sock, serving both services (skeleton + registration).
        assert [p.name for p in plugin_dir.iterdir()] == [f"{PLUGIN}.sock"]
        with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
            info = reg.PluginInfo.FromString(
                _unary_raw(channel, "/pluginregistration.Registration/GetInfo", b"")
            )
            assert (info.type, info.name, info.endpoint) == ("ReporterPlugin", PLUGIN, "")
            assert list(info.supported_versions) == ["v1alpha1"]
            raw = _unary_raw(
                channel, "/reporterplugin.v1alpha1.ReporterPlugin/GetReportContent", b""
            )
            # Byte for byte what the project's proto encodes for the same message: gogo's
            # marshalling (GVK's proto2 strings included) and protobuf's agree on the wire.
            assert raw == _expected_response(FIRST).SerializeToString()
            # Nothing the project's schema does not know (it would come back re-serialized).
            parsed = rp.GetReportContentResponse.FromString(raw)
            assert parsed == _expected_response(FIRST) and parsed.SerializeToString() == raw

            stream = channel.unary_stream(
                "/reporterplugin.v1alpha1.ReporterPlugin/ListAndWatchReportContent",
                request_serializer=rp.Empty.SerializeToString,
                response_deserializer=rp.GetReportContentResponse.FromString,
            )(rp.Empty(), timeout=60)
            assert next(stream) == _expected_response(FIRST)
            plugin.update(SECOND)
            assert next(stream) == _expected_response(SECOND)
            # A broken file is logged and the last good content kept (nothing is sent for it).
            plugin.content_path.write_text('{"content": [{"feld": []}]}')
            plugin.proc.send_signal(signal.SIGHUP)
            until(lambda: NOT_RELOADED in plugin.log(), "the reload error")
            assert 'unknown field "feld"' in plugin.log()
            plugin.update(FIRST)
            assert next(stream) == _expected_response(FIRST)
            stream.cancel()
        assert plugin.stop() == 0
        # The skeleton removes its socket on the way out: that is how the agent sees it go.
        assert not plugin.socket.exists()
    finally:
        plugin.close()


# --------------------------------------------------------------------------
# against `nodeagent run` and the real kube-apiserver


@pytest.fixture
def cnr_access(apiserver: ApiServer) -> Iterator[None]:
    """The shipped CNR CRD and node access installed; no CNR of node-a before or after."""

    async def delete() -> None:
        async with client_for(apiserver, "admin") as admin:
            with suppress(errors.NotFound):
                await admin.delete(CNR, NODE)

    async def install() -> None:
        async with client_for(apiserver, "admin") as admin, client_for(apiserver, NODE) as node:
            await install_cnr_crd(admin)
            await install_cnr_node_access(admin, node, NODE)
        await delete()

    trio.run(install)
    yield
    trio.run(delete)


def get_cnr(apiserver: ApiServer) -> dict[str, Any] | None:
    status, body = apiserver.request("GET", CNR.path(None, NODE))
    if status == 404:
        return None
    assert status == 200, body
    doc: dict[str, Any] = body
    return doc


_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$", re.M)
_WRITE_VERBS = {"CREATE", "UPDATE", "PATCH", "APPLY", "DELETE"}


def apiserver_cnr_writes(apiserver: ApiServer) -> float:
    """Every write request the apiserver has served on CustomNodeResources (dry runs left out),
    by its own request counter."""
    status, text = apiserver.request("GET", "/metrics", headers={"Accept": "text/plain"})
    assert status == 200, text
    total = 0.0
    for labels, value in _SAMPLE.findall(text):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if (
            tags.get("resource") == "customnoderesources"
            and tags.get("verb") in _WRITE_VERBS
            and not tags.get("dry_run")
        ):
            total += float(value)
    return total


def start_cluster_agent(
    start_agent: StartAgent,
    apiserver: ApiServer,
    registry: pathlib.Path,
    *args: str,
    grace: float = GRACE,
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        str(registry),
        "--set",
        f"reporter.grace={grace}",
        *args,
    )
    agent.wait_ready()
    return agent


def cnr_view(agent: AgentProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(agent.get("/v1/cnr")[1])
    return doc


def zone_key(zone: dict[str, Any]) -> tuple[str, str]:
    return zone["type"], zone["name"]


def baseline(apiserver: ApiServer, agent: AgentProcess) -> dict[str, Any]:
    """The CNR the agent writes from its in-tree system reporter alone, once in sync."""

    def check() -> dict[str, Any] | None:
        sync = cnr_view(agent).get("sync") or {}
        cnr = get_cnr(apiserver)
        if not sync.get("synced") or cnr is None:
            return None
        spec, status = cnr.get("spec") or {}, cnr.get("status") or {}
        return cnr if spec.get("nodeResourceProperties") and status.get("topologyZone") else None

    return until(check, "the in-tree system reporter's CNR")


def merged_with(base: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    """Katalyst's rules applied to `base` (the CNR of the system reporter alone, with what the
    apiserver defaulted: status.topologyPolicy "none") and one plugin's content: a reported
    field replaces the CNR's (its first occurrence zeroes it); the TopologyZone lists of both
    reporters are concatenated, deduplicated by (type, name) and sorted by it. Returns the
    expected {labels, spec, status}."""
    want: dict[str, Any] = json.loads(json.dumps(observed(base)))
    for item in content["content"][0]["field"]:
        name, value = item["fieldName"], item["value"]
        if item["fieldType"] == "Metadata" and name == "Labels":
            want["labels"] = dict(value)
        elif item["fieldType"] == "Status" and name == "TopologyZone":
            zones = want["status"].setdefault("topologyZone", [])
            seen = {zone_key(z) for z in zones}
            zones += [z for z in value if zone_key(z) not in seen]
            zones.sort(key=zone_key)
        else:
            section = "status" if item["fieldType"] == "Status" else "spec"
            want[section][name[0].lower() + name[1:]] = value
    return want


def observed(cnr: dict[str, Any] | None) -> dict[str, Any] | None:
    """The parts of a CNR the reporter writes (None: no CNR), memory sizes masked."""
    if cnr is None:
        return None
    doc = {
        "labels": cnr["metadata"].get("labels") or {},
        "spec": cnr.get("spec") or {},
        "status": cnr.get("status") or {},
    }
    return _mask_memory(json.loads(json.dumps(doc)))


MEMORY = "<MemTotal>"


def _mask_memory(doc: dict[str, Any]) -> dict[str, Any]:
    """The system reporter reports MemTotal (the `memory` property, each Numa zone's memory),
    which moves on this VM while it runs (23.7 to 24.7 GB within minutes, memory ballooning):
    such a change is a real report, not the merge under test."""
    for prop in doc["spec"].get("nodeResourceProperties") or []:
        if prop.get("propertyName") == "memory":
            prop["propertyQuantity"] = MEMORY

    def zones(items: list[dict[str, Any]]) -> None:
        for zone in items:
            for kind in ("allocatable", "capacity"):
                resources = (zone.get("resources") or {}).get(kind) or {}
                if "memory" in resources and zone.get("type") == "Numa":
                    resources["memory"] = MEMORY
            zones(zone.get("children") or [])

    zones(doc["status"].get("topologyZone") or [])
    return doc


def wait_cnr(apiserver: ApiServer, want: dict[str, Any], what: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cnr = get_cnr(apiserver)
        return cnr if cnr is not None and observed(cnr) == want else None

    try:
        return until(check, what)
    except AssertionError as exc:
        got = observed(get_cnr(apiserver))
        raise AssertionError(
            f"{exc}\nwant: {json.dumps(want, indent=1)}\ngot: {json.dumps(got, indent=1)}"
        ) from None


def wait_plugin_states(agent: AgentProcess, running: int, stopped: int) -> None:
    """The report store's plugins by state (the system reporter counts as running)."""

    def check() -> bool:
        return (
            metric_sum(agent, "nodeagent_reporter_plugins", 'state="running"') == running
            and metric_sum(agent, "nodeagent_reporter_plugins", 'state="stopped"') == stopped
        )

    until(check, f"{running} running and {stopped} stopped reporter plugins")


@pytest.mark.usefixtures("cnr_access")
def test_upstream_plugin_merged_into_the_cnr_updated_and_kept_for_the_grace(
    apiserver: ApiServer,
    start_agent: StartAgent,
    plugin_dir: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    agent = start_cluster_agent(start_agent, apiserver, plugin_dir)
    base = baseline(apiserver, agent)
    # The system reporter reports no label (and none is configured): the CNR has none.
    assert observed(base)["labels"] == {}  # type: ignore[index]

    plugin = KatalystPlugin.start(PLUGIN, plugin_dir, FIRST, workdir=tmp_path)
    try:
        # 1. Merged with the in-tree reporter: its properties and Socket zones, the plugin's
        # label, policy, resources and NIC zone (sorted before the Sockets).
        want = merged_with(base, FIRST)
        assert ("NIC", "eth0") in [zone_key(z) for z in want["status"]["topologyZone"]]
        wait_cnr(apiserver, want, "the plugin's fields merged into the CNR")
        view = cnr_view(agent)
        assert {PLUGIN, "system-reporter-plugin"} <= set(view["plugins"])
        assert view["bad_fields"] == []

        # 2. A content update (the skeleton's ListAndWatch sends it) reaches the CNR: the label's
        # new value, the smaller resources, the NIC zone gone.
        plugin.update(SECOND)
        wait_cnr(apiserver, merged_with(base, SECOND), "the plugin's update in the CNR")

        # 3. The plugin crashes: its fields stay for reporter.grace, then leave the CNR.
        plugin.kill()
        killed = time.monotonic()
        wait_plugin_states(agent, running=1, stopped=1)
        held = observed(get_cnr(apiserver))
        want = merged_with(base, SECOND)
        assert held == want, f"{json.dumps(held, indent=1)}\n{json.dumps(want, indent=1)}"
        wait_cnr(apiserver, merged_with(base, cnr_content([])), "the fields removed")
        gone_after = time.monotonic() - killed
        assert gone_after >= GRACE, f"removed {gone_after:.1f}s after the kill"
        assert metric_sum(agent, "nodeagent_reporter_reports_expired_total") == 1
        wait_plugin_states(agent, running=1, stopped=0)
        assert PLUGIN not in cnr_view(agent)["plugins"]
    finally:
        plugin.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def checkpointed(
    state_dir: pathlib.Path,
) -> dict[str, tuple[rp.GetReportContentResponse | PlainReport, float | None]]:
    path = state_dir / "checkpoints" / "reporter_manager_checkpoint"
    if not path.exists():
        return {}
    return decode_checkpoint(decode_checkpoint_file(path.read_bytes()))


def unchanged_syncs(agent: AgentProcess) -> float:
    """CNR syncs that found nothing to write."""
    return metric_sum(agent, "nodeagent_cnr_writes_total", 'result="unchanged"')


@pytest.mark.usefixtures("cnr_access")
def test_restart_from_the_checkpoint_writes_nothing(
    apiserver: ApiServer,
    start_agent: StartAgent,
    plugin_dir: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    # Without the system reporter: it reads this VM's MemTotal, which moves (see _mask_memory),
    # and a changed report is rightly written; the plugin's report alone makes the restart's
    # "nothing to write" deterministic. The grace is long: the restarted agent keeps the
    # checkpointed report until the plugin is back.
    args = ("--set", "reporter.system_reporter=false")
    grace = 120.0
    # A CNR no one reported to yet, as the apiserver holds it (the CRD defaults topologyPolicy).
    empty = {"metadata": {"name": NODE}, "status": {"topologyPolicy": "none"}}
    want = merged_with(empty, FIRST)
    plugin = KatalystPlugin.start(PLUGIN, plugin_dir, FIRST, workdir=tmp_path)
    try:
        first = start_cluster_agent(start_agent, apiserver, plugin_dir, *args, grace=grace)
        wait_cnr(apiserver, want, "the plugin's fields in the CNR")
        # The checkpoint holds the plugin's report as the plugin sent it.
        until(lambda: PLUGIN in checkpointed(first.state_dir), "the plugin in the checkpoint")
        response, stopped_at = checkpointed(first.state_dir)[PLUGIN]
        assert response == _expected_response(FIRST) and stopped_at is None
        # The node goes down: the agent and the plugin stop.
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
        assert plugin.stop() == 0
    finally:
        plugin.close()
    cnr = get_cnr(apiserver)
    assert cnr is not None and observed(cnr) == want
    writes = apiserver_cnr_writes(apiserver)
    assert writes >= 2  # the first agent's create and status write at least

    # The agent comes back first, on the same state directory: the checkpoint restores the
    # plugin's report (stopped, within the grace), the merge equals the CNR, nothing is
    # written. Without the checkpoint the plugin's fields would be removed, then written again.
    second = start_cluster_agent(
        start_agent, apiserver, plugin_dir, *args, "--state-dir", str(first.state_dir), grace=grace
    )
    wait_plugin_states(second, running=0, stopped=1)
    until(lambda: (cnr_view(second).get("sync") or {}).get("synced"), "the CNR sync")
    assert PLUGIN in cnr_view(second)["plugins"]
    syncs = unchanged_syncs(second)
    assert syncs >= 1

    # Then the plugin, with the same report: running again, one more sync, still no write.
    plugin = KatalystPlugin.start(PLUGIN, plugin_dir, FIRST, workdir=tmp_path)
    try:
        wait_plugin_states(second, running=1, stopped=0)
        until(lambda: unchanged_syncs(second) > syncs, "the sync after the plugin's return")
        assert cnr_view(second)["sync"]["writes"] == 0
        for verb in ("create", "apply", "status"):
            assert metric_sum(second, "nodeagent_cnr_writes_total", f'verb="{verb}"') == 0, verb
        assert apiserver_cnr_writes(apiserver) == writes
        again = get_cnr(apiserver)
        assert again is not None and observed(again) == want
        assert again["metadata"]["resourceVersion"] == cnr["metadata"]["resourceVersion"]
        second.signal(signal.SIGTERM)
        assert second.wait(timeout=15) == 0
    finally:
        plugin.close()
