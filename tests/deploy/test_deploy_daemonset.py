"""Everything in deploy/crds and deploy/kubernetes applied to the real kube-apiserver (server-side
apply, dry-run first), then `nodeagent run` started with exactly what a pod of the shipped
DaemonSet gets: the container's own args and env, the in-cluster environment
(KUBERNETES_SERVICE_HOST/PORT) and a service-account token from the TokenRequest API bound to a
Pod on the node, mounted at /var/run/secrets/kubernetes.io/serviceaccount (in a private mount
namespace, as the kubelet's projected volume is). It publishes a real plugin's slices (the upstream
Go DRA helper), writes its CustomNodeResource from an SDK reporter plugin and its
NodeAgentConfigOK condition: the RBAC is sufficient. The same token cannot write another node's
slices, CNR or status, nor anything but its own condition on its own Node: the admission
policies scope it.

Twice, each on an apiserver of its own: with the plain manifests (deploy/kubernetes), and with the
Helm chart's objects alone (deploy/helm/nodeagent rendered with tests/deploy/helm-values-full.yaml:
another release, namespace, service account, host directory and ports, and a config file, which
the agent runs with)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import NODES, RESOURCESLICES, ClusterConfig, KubeClient, Resource, errors
from tests.deploy.manifests import (
    CONFIG_FILE,
    PLAIN,
    Install,
    apply_all,
    chart_install,
    create_pod,
    daemonset_args,
    daemonset_container,
    daemonset_pod_spec,
    delete_pod,
    pod_token,
)
from tests.process.conftest import NotifyListener
from tests.support.apiserver import ApiServer, free_ports, start_apiserver
from tests.support.crds import CNR, cnr
from tests.support.draplugin import DraPlugin, KubeletDirs, instance, kubelet_dirs, named_resources
from tests.support.http import http_get
from tests.support.nodeagentconfig import NAC, nodeagentconfig


@pytest.fixture(scope="module", params=["plain", "chart"])
def install(request: pytest.FixtureRequest) -> Install:
    return PLAIN if request.param == "plain" else chart_install()


@pytest.fixture(scope="module")
def apiserver(install: Install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An apiserver of its own for each install: the policies applied here bind cluster-wide, and
    each install must be sufficient alone."""
    server = start_apiserver(tmp_path_factory.mktemp("apiserver"))
    try:
        yield server
    finally:
        server.close()


NODE = "ds-node-1"
OTHER = "ds-node-2"
POD = "nodeagent-ds-1"
DRIVER = "gpu.deploy.example.com"
REPORTER = """
import sys, trio
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reports import ReportItem
GVK = ("node.katalyst.kubewharf.io", "v1alpha1", "CustomNodeResource")
async def main(registry_dir):
    async with ReporterPlugin.serve(name="zones", registry_dir=registry_dir) as plugin:
        item = ReportItem(*GVK, "Status", "TopologyPolicy", "SingleNUMANodeContainerLevel")
        await plugin.report([item])
        await trio.sleep_forever()
trio.run(main, sys.argv[1])
"""
CONDITION = "NodeAgentConfigOK"
# Where the kubelet mounts the token; nodeagent.kube reads it from there (not configurable).
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"
# Run the agent in a mount namespace of its own with a tmpfs over /run and the token directory
# bound read-only at SA_DIR: the host's /run is untouched. $1 is the directory, the rest the
# command.
POD_MOUNTS = f"""set -e
mount -t tmpfs -o mode=0755 nodeagent-test /run
mkdir -p {SA_DIR}
mount --bind "$1" {SA_DIR}
mount -o remount,bind,ro {SA_DIR}
shift
exec "$@"
"""
WAIT = 60.0
POLL = 0.1


def _client(apiserver: ApiServer, token: str) -> KubeClient:
    config = ClusterConfig(server=apiserver.url, ca_file=str(apiserver.ca_file), token=token)
    return KubeClient(config, qps=500.0, burst=1000)


def _admin(apiserver: ApiServer) -> KubeClient:
    return _client(apiserver, apiserver.token("admin"))


async def _until(check: Callable[[], Any], what: str) -> Any:
    """Poll ``check`` (sync or async) until it returns a true value; fail after WAIT seconds."""
    with trio.move_on_after(WAIT):
        while True:
            value = check()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(POLL)
    raise AssertionError(f"timed out waiting for {what}")


def pod_command(
    install: Install, dirs: KubeletDirs, ops_port: int, public_port: int, config_dir: pathlib.Path
) -> tuple[list[str], dict[str, str]]:
    """The DaemonSet container's args and env as the pod gets them, with the hostPath mapped to
    ``dirs.root``, the two ports replaced (the test shares the host's network) and the chart's
    config file (its ConfigMap's config.toml) written in ``config_dir``."""
    container = daemonset_container(install)
    host_state = install.host_state()
    config = install.config_toml()
    config_file = None
    if config is not None:
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
        assert f"{mount['mountPath']}/config.toml" == CONFIG_FILE
        config_file = str(config_dir / "config.toml")
        pathlib.Path(config_file).write_text(config)
    args = daemonset_args(str(dirs.root), ops_port, public_port, install, config_file)
    volumes = {v["name"]: v for v in daemonset_pod_spec(install)["volumes"]}
    (state,) = [m for m in container["volumeMounts"] if m["mountPath"] == host_state]
    assert volumes[state["name"]]["hostPath"]["path"] == host_state
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            if item["value"] == install.host_runtime():
                # The runtime directory: one of the test's, not the host's own /run/nodeagent.
                runtime = dirs.root / "runtime"
                runtime.mkdir(exist_ok=True)
                env[item["name"]] = str(runtime)
            continue
        assert item["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", item
        env[item["name"]] = NODE
    return args, env


def _get(port: int, path: str) -> tuple[int, str]:
    return http_get(f"127.0.0.1:{port}", path)


@pytest.fixture
def dirs() -> Iterator[KubeletDirs]:
    made = kubelet_dirs("na-ds-")
    yield made
    made.remove()


@pytest.fixture
async def installed(apiserver: ApiServer, install: Install) -> AsyncIterator[KubeClient]:
    """Every object of the install applied; the Nodes; an admin client."""
    async with _admin(apiserver) as admin:
        applied = await apply_all(admin, install)
        kinds = {kind for kind, _ in applied}
        assert {"CustomResourceDefinition", "DaemonSet", "ValidatingAdmissionPolicy"} <= kinds
        for name in (NODE, OTHER):
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            await admin.apply(NODES, node, field_manager="test")
            kubelet = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
            status = {"capacity": {"cpu": "4"}, "conditions": [kubelet]}
            await admin.patch(
                NODES, name, {"status": status}, type="strategic", subresource="status"
            )
        yield admin


@pytest.fixture
async def token(installed: KubeClient, install: Install) -> AsyncIterator[str]:
    """The token the kubelet would mount into the agent's pod on NODE."""
    pod = await create_pod(installed, POD, NODE, install)
    try:
        yield await pod_token(installed, pod, install=install)
    finally:
        await delete_pod(installed, POD, install)


@pytest.fixture
def sa_dir(
    tmp_path: pathlib.Path, apiserver: ApiServer, token: str, install: Install
) -> pathlib.Path:
    """The projected volume's three files."""
    path = tmp_path / "serviceaccount"
    path.mkdir()
    (path / "token").write_text(token)
    shutil.copy(apiserver.ca_file, path / "ca.crt")
    (path / "namespace").write_text(install.namespace)
    return path


@pytest.fixture
def plugins(dirs: KubeletDirs, tmp_path: pathlib.Path) -> Iterator[None]:
    """The upstream DRA helper and an SDK reporter plugin, registered in the pod's registry."""
    dra = DraPlugin.start(
        DRIVER, dirs, [named_resources(instance("gpu-0"), instance("gpu-1"))], workdir=tmp_path
    )
    reporter = subprocess.Popen([sys.executable, "-c", REPORTER, str(dirs.registry)])
    try:
        yield
    finally:
        reporter.send_signal(signal.SIGTERM)
        reporter.wait(timeout=15)
        dra.close()


@pytest.fixture
def agent(
    apiserver: ApiServer,
    install: Install,
    dirs: KubeletDirs,
    sa_dir: pathlib.Path,
    tmp_path: pathlib.Path,
    plugins: None,
) -> Iterator[tuple[int, int]]:
    """`nodeagent run` as the DaemonSet's pod on NODE, READY; its (ops, public) ports."""
    ops_port, public_port = free_ports(2)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    args, pod_env = pod_command(install, dirs, ops_port, public_port, config_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.pop("NODE_NAME", None)
    host, _, port = apiserver.url.removeprefix("https://").rpartition(":")
    env |= pod_env | {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    notify = NotifyListener(tmp_path / "notify")
    env["NOTIFY_SOCKET"] = notify.path
    command = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        POD_MOUNTS,
        "pod",
        str(sa_dir),
        sys.executable,
        "-m",
        "nodeagent",
        *args,
    ]
    log = open(tmp_path / "agent.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            notify.wait_for("READY")
        except AssertionError:
            proc.kill()
            proc.wait()
            raise AssertionError((tmp_path / "agent.log").read_text()) from None
        yield ops_port, public_port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        notify.close()


async def _slices(admin: KubeClient, node: str) -> list[dict[str, Any]]:
    body = await admin.request(
        "GET", RESOURCESLICES.path(None), params={"fieldSelector": f"spec.nodeName={node}"}
    )
    items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
    return items


async def _condition(admin: KubeClient, node: str) -> dict[str, Any] | None:
    status = msgspec.json.decode(await admin.get(NODES, node)).get("status", {})
    for condition in status.get("conditions", []):
        if condition["type"] == CONDITION:
            found: dict[str, Any] = condition
            return found
    return None


async def _cnr(admin: KubeClient, node: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = msgspec.json.decode(await admin.get(CNR, node))
    except errors.NotFound:
        return None
    return found


def _slice(node: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCESLICES.api_version,
        "kind": RESOURCESLICES.kind,
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-9"}],
        },
    }


async def test_the_daemonset_identity_publishes_its_node_and_only_its_node(
    apiserver: ApiServer,
    install: Install,
    installed: KubeClient,
    token: str,
    agent: tuple[int, int],
) -> None:
    admin = installed
    ops_port, public_port = agent

    # The agent, in-cluster, with the pod's token: slices of the real plugin...
    async def published() -> list[dict[str, Any]] | None:
        slices = [s for s in await _slices(admin, NODE) if s["spec"]["driver"] == DRIVER]
        names = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
        return slices if names == ["gpu-0", "gpu-1"] else None

    (published_slice,) = await _until(published, "the plugin's slice published")
    owner = published_slice["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", NODE)

    # ... its CustomNodeResource with the reporter plugin's field ...
    async def reported() -> bool:
        found = await _cnr(admin, NODE)
        status = (found or {}).get("status", {})
        return status.get("topologyPolicy") == "SingleNUMANodeContainerLevel"

    await _until(reported, "the CNR written")
    if install.config_toml() is not None:
        # The chart's config file is the agent's: the CNR was created with its default labels.
        labels = ((await _cnr(admin, NODE)) or {})["metadata"].get("labels", {})
        assert labels.get("team.example.com/owner") == "platform", labels

    # ... and its config condition, local first, then for a NodeAgentConfig naming the node.
    async def condition_reason(reason: str) -> bool:
        return ((await _condition(admin, NODE)) or {}).get("reason") == reason

    await _until(lambda: condition_reason("Local"), "the Local condition")
    config = {"plugins": {"scan_interval": 0.25}}
    await admin.create(NAC, nodeagentconfig("fleet", spec={"nodeNames": [NODE], "config": config}))
    await _until(lambda: condition_reason("OnTrial"), "the OnTrial condition")
    node = msgspec.json.decode(await admin.get(NODES, NODE))
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["reason"] == "KubeletReady", "the kubelet's condition is kept"

    # The agent's view says it is in-cluster with the service account.
    code, body = _get(ops_port, "/v1/status")
    assert code == 200, body
    assert json.loads(body)["mode"] == "cluster"
    # The public listener: probes and metrics, none of the debug views.
    assert _get(public_port, "/healthz")[0] == 200
    assert _get(public_port, "/readyz")[0] == 200
    code, metrics = _get(public_port, "/metrics")
    assert code == 200 and "nodeagent_component_ready" in metrics
    assert _get(public_port, "/v1/status")[0] == 404
    assert _get(public_port, "/v1/config")[0] == 404


async def test_the_daemonset_identity_cannot_write_another_nodes_objects(
    apiserver: ApiServer, install: Install, installed: KubeClient, token: str
) -> None:
    admin = installed
    async with _client(apiserver, token) as pod:
        await _until(lambda: _policies_enforced(pod, install), "the three policies in force")
        # Its own node's slices: create, update and delete allowed.
        own = msgspec.json.decode(await pod.create(RESOURCESLICES, _slice(NODE, "own-slice")))
        own["metadata"]["labels"] = {"a": "b"}
        await pod.update(RESOURCESLICES, own)
        await pod.delete(RESOURCESLICES, "own-slice")

        refusals = []
        with pytest.raises(errors.Forbidden) as refused:
            await pod.create(RESOURCESLICES, _slice(OTHER, "other-slice"))
        refusals.append(refused.value.message)
        foreign = msgspec.json.decode(
            await admin.create(RESOURCESLICES, _slice(OTHER, "foreign-slice"))
        )
        foreign["metadata"]["labels"] = {"a": "b"}
        with pytest.raises(errors.Forbidden) as refused:
            await pod.update(RESOURCESLICES, foreign)
        refusals.append(refused.value.message)
        with pytest.raises(errors.Forbidden) as refused:
            await pod.delete(RESOURCESLICES, "foreign-slice")
        refusals.append(refused.value.message)
        for message in refusals:
            assert f"{install.policy_prefix}-resourceslices-own-node-sa" in message
            assert f"nodeagent on node {NODE} may write only ResourceSlices" in message
            assert f"not {OTHER}" in message

        with pytest.raises(errors.Forbidden) as refused:
            await pod.create(CNR, cnr(OTHER))
        assert f"may write only the CustomNodeResource named {NODE}, not {OTHER}" in (
            refused.value.message
        )

        ours = {"type": CONDITION, "status": "True", "reason": "Local", "message": "test"}
        with pytest.raises(errors.Forbidden) as refused:
            await pod.patch(
                NODES,
                OTHER,
                {"status": {"conditions": [ours]}},
                type="strategic",
                subresource="status",
            )
        assert f"may patch only the status of Node {NODE}, not {OTHER}" in refused.value.message
        # On its own Node, only its own condition: not the kubelet's, not the capacity, not the
        # labels (which a status patch can change).
        for patch in (
            {"status": {"conditions": [ours | {"type": "Ready", "status": "False"}]}},
            {"status": {"capacity": {"cpu": "64"}}},
            {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
        ):
            with pytest.raises(errors.Forbidden) as refused:
                await pod.patch(NODES, NODE, patch, type="strategic", subresource="status")
            assert "may change only the NodeAgentConfigOK condition" in refused.value.message
        # The Node object itself: RBAC gives none.
        with pytest.raises(errors.Forbidden):
            await pod.patch(NODES, NODE, {"metadata": {"labels": {"a": "b"}}})
        await pod.patch(
            NODES, NODE, {"status": {"conditions": [ours]}}, type="strategic", subresource="status"
        )
    await admin.delete(RESOURCESLICES, "foreign-slice")


async def _dry_run(
    client: KubeClient,
    resource: Resource,
    body: dict[str, Any],
    *,
    name: str | None = None,
    subresource: str | None = None,
) -> None:
    """A create (or, with ``name``, a strategic-merge patch) with ``dryRun=All``: admitted or
    refused as the write would be, and never stored."""
    await client.request(
        "POST" if name is None else "PATCH",
        resource.path(None, name, subresource),
        params={"dryRun": "All"},
        body=msgspec.json.encode(body),
        content_type=(
            "application/json" if name is None else "application/strategic-merge-patch+json"
        ),
        verb="create" if name is None else "patch",
        resource=resource.plural,
        idempotent=False,
    )


async def _dry_run_create(client: KubeClient, body: dict[str, Any]) -> None:
    await _dry_run(client, RESOURCESLICES, body)


async def _refused_by(write: Awaitable[None], policy: str) -> bool:
    try:
        await write
    except errors.Forbidden as exc:
        return policy in exc.message
    return False


async def _slice_policy_enforced(client: KubeClient, install: Install) -> bool:
    return await _refused_by(
        _dry_run_create(client, _slice(OTHER, "probe")),
        f"{install.policy_prefix}-resourceslices-own-node-sa",
    )


async def _policies_enforced(client: KubeClient, install: Install) -> bool:
    """Each of the chart's three per-node policies refuses a dry run on another node's object
    (RBAC, policies and their bindings reach the apiserver's informers one by one, a moment
    after they are applied)."""
    condition = {"type": CONDITION, "status": "True", "reason": "Local", "message": "probe"}
    return (
        await _slice_policy_enforced(client, install)
        and await _refused_by(
            _dry_run(client, CNR, cnr(OTHER)), f"may write only the CustomNodeResource named {NODE}"
        )
        and await _refused_by(
            _dry_run(
                client,
                NODES,
                {"status": {"conditions": [condition]}},
                name=OTHER,
                subresource="status",
            ),
            f"may patch only the status of Node {NODE}",
        )
    )


async def test_a_token_not_bound_to_a_node_is_refused(
    apiserver: ApiServer, install: Install, installed: KubeClient, token: str
) -> None:
    # `token` (bound) first proves the policies are in force, so the refusals below are theirs.
    async with _client(apiserver, token) as pod:
        await _until(
            lambda: _slice_policy_enforced(pod, install), "the ResourceSlice policy in force"
        )
    unbound_token = await pod_token(installed, None, install=install)
    ours = {"type": CONDITION, "status": "True", "reason": "Local", "message": "test"}
    async with _client(apiserver, unbound_token) as unbound:
        with pytest.raises(errors.Forbidden) as refused:
            await _dry_run_create(unbound, _slice(NODE, "unbound-slice"))
        assert "writes ResourceSlices only with a token bound to a pod" in refused.value.message
        with pytest.raises(errors.Forbidden) as refused:
            await unbound.patch(
                NODES,
                NODE,
                {"status": {"conditions": [ours]}},
                type="strategic",
                subresource="status",
            )
        assert "writes Node status only with a token bound to a pod" in refused.value.message
