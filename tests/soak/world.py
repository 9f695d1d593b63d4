"""The soak's world: one kube-apiserver (the harness), a pass-through `FaultProxy` in front of it,
an agent per node (node-a, node-b) talking through the proxy, SDK DRA plugin processes per node
whose inventories the soak rewrites, and admin access for the cluster-side reads and writes.

Everything is a real process; the world only starts, signals and reads them.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from tests.integration.conftest import client_for
from tests.process.conftest import NotifyListener
from tests.support.apiserver import ApiServer, start_apiserver
from tests.support.crds import (
    REPO_ROOT,
    apply_manifest,
    install_cnr_crd,
    install_cnr_node_access,
)
from tests.support.faultproxy import FaultProxy
from tests.support.file_plugin import command
from tests.support.nodeagentconfig import install_nodeagentconfig_crd, loosen_nodeagentconfig_crd

NODES = ("node-a", "node-b")
SLICE_MAX = 128  # devices per slice, as the agent lays a native pool out
NAC_ACCESS = REPO_ROOT / "deploy" / "kubernetes" / "nodeagentconfig-node-access.yaml"
NAC_PATH = "/apis/nodeagent.io/v1alpha1/nodeagentconfigs"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CNR_PATH = "/apis/node.katalyst.kubewharf.io/v1alpha1/customnoderesources"
REPORT_PREFIX = "soak.nodeagent.io/"  # the reporter plugins' CNR annotations: prefix + name
MANAGED_BY = "app.kubernetes.io/managed-by"

# Time-compressed settings (the process tests' values, or shorter): a trial of 20 s, plugin
# probes every 0.5 s, a gone plugin's slices kept 2 s, leftovers of plugins that never came back
# deleted 3 s after a start, a pool unpublished for 2 s a health signal. Everything else is the
# shipped default.
SETTINGS = (
    "dynconfig.trial_duration=20",
    "dynconfig.health_interval=0.5",
    "dynconfig.unready_bound=10",
    "resources.disconnect_grace=2",
    "resources.startup_grace=3",
    # A pool unpublished this long turns `resources` not ready (shipped: 120 s, longer than
    # the trial): a slow-to-fail config is then rolled back within its trial.
    "resources.publish_failure_bound=2",
    "reporter.grace=2",
    "plugins.scan_interval=0.2",
    "plugins.probe_interval=0.5",
    "agent.cluster_probe_interval=0.5",
)


def report(name: str, tag: str) -> list[dict[str, Any]]:
    """A reporter plugin's fields: one CNR annotation, its value ``tag``."""
    return [{"name": REPORT_PREFIX + name, "value": tag}]


def inventory(n: int, tag: str) -> list[dict[str, Any]]:
    """n devices; ``tag`` (the `model` attribute) names the inventory."""
    return [
        {"name": f"dev-{i}", "attributes": {"index": i, "model": tag}, "capacity": {"mem": "1Gi"}}
        for i in range(n)
    ]


class ApiDown(Exception):
    """The apiserver did not answer (restarting): an observation that cannot be made now."""


@dataclass
class Plugin:
    """One driver's plugin on one node: its process (None while stopped) and inventory."""

    node: str
    driver: str
    registry: str
    inventory_file: Path
    devices: list[dict[str, Any]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    stopped_at: float | None = None  # monotonic, when the soak last stopped it
    kind: str = "dra"  # "dra" (a DRA driver: devices) or "reporter" (devices: its fields)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def set_inventory(self, devices: list[dict[str, Any]]) -> None:
        self.devices = devices
        tmp = self.inventory_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(devices))
        os.replace(tmp, self.inventory_file)

    def start(self) -> None:
        # tests/support/file_plugin.py: no signal handling, so a kill leaves its socket.
        pool = self.node if self.kind == "dra" else ""
        self.proc = subprocess.Popen(
            command(self.kind, self.registry, self.inventory_file, self.driver, pool=pool),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.stopped_at = None

    def stop(self, signum: int = signal.SIGKILL) -> None:
        """Kill the process (its registration socket stays: nobody removes it)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signum)
            self.proc.wait(30)
            self.proc = None
        self.stopped_at = time.monotonic()


class Agent:
    """`nodeagent run` for one node; stderr to a file, READY and the ops address from its
    sd_notify messages. Exits the soak did not ask for are the crash invariant's."""

    def __init__(self, world: World, node: str) -> None:
        world.agent_runs += 1
        self.node = node
        self.run = world.agent_runs
        self.notify = NotifyListener(world.dir / f"notify-{self.run}")
        self.log = world.dir / f"agent-{node}-{self.run}.log"
        self.ops = ""
        self.ready_at: float | None = None
        self.expected_exit = False  # the soak signalled it
        self.started_at = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["NOTIFY_SOCKET"] = self.notify.path
        args = [
            "run",
            "--kubeconfig",
            str(world.kubeconfigs[node]),
            "--node-name",
            node,
            "--registry-dir",
            world.registries[node],
            "--state-dir",
            str(world.dir / f"state-{node}"),
            # Where dynconfig keeps its state while the state directory cannot be written (as
            # systemd's RuntimeDirectory=): on another file system than the state.
            "--set",
            f"agent.runtime_dir={world.dir / f'run-{node}'}",
            "--ops-address",
            "127.0.0.1:0",
        ]
        for s in SETTINGS:
            args += ["--set", s]
        with self.log.open("w") as err:
            # The agent with the soak's crash hook (tests/soak/crash_agent.py): a config in its
            # range makes it exit, as a config that crashes a real agent does.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.soak.crash_agent", *args],
                env=env,
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        fields = self.notify.wait_for("READY", timeout=timeout)
        self.ops = fields["STATUS"].split("ops on ", 1)[1].split()[0]
        self.ready_at = time.monotonic()

    def get(self, path: str, timeout: float = 5) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.ops}{path}", timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except http.client.HTTPException as exc:
            # Half an answer: the agent died while it wrote it (a crash-inducing config, a
            # kill). Not observable now, as a refused connection.
            raise OSError(f"GET {path}: {exc!r}") from exc

    def doc(self, path: str) -> Any:
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"GET {path} -> {status}: {body[:300]}")
        return json.loads(body)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, signum: int) -> int:
        """Signal the agent and wait for it to exit; its exit status."""
        self.expected_exit = True
        if self.alive():
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return -999  # did not stop within 60 s: the caller reports it
        finally:
            self.notify.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class World:
    dir: Path
    apiserver: ApiServer
    proxy: FaultProxy
    registries: dict[str, str] = field(default_factory=dict)
    kubeconfigs: dict[str, Path] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)
    plugins: list[Plugin] = field(default_factory=list)
    reporters: list[Plugin] = field(default_factory=list)  # kind "reporter"
    agent_runs: int = 0
    read_only: set[str] = field(default_factory=set)  # nodes whose checkpoints are mounted ro
    full: set[str] = field(default_factory=set)  # nodes whose state file system is full
    small_disk: set[str] = field(default_factory=set)  # nodes whose state dir is a small tmpfs

    @classmethod
    def start(cls, workdir: Path) -> World:
        workdir.mkdir(parents=True, exist_ok=True)
        apiserver = start_apiserver(workdir / "apiserver", nodes=NODES)
        try:
            proxy = FaultProxy(apiserver).start()
        except BaseException:
            apiserver.close()
            raise
        world = cls(workdir, apiserver, proxy)
        try:
            world._mount_small_disk("node-a")
            trio.run(world._install)
            for node in NODES:
                world.ensure_node(node)
                world.registries[node] = tempfile.mkdtemp(prefix=f"na-soak-{node}-", dir="/tmp")
                crt, key = apiserver.cert_files(node)
                world.kubeconfigs[node] = apiserver.write_kubeconfig(
                    workdir / f"kubeconfig-{node}.json",
                    {"client-certificate": str(crt), "client-key": str(key)},
                    proxy.url,
                )
        except BaseException:
            world.close()
            raise
        return world

    async def _install(self) -> None:
        """The NodeAgentConfig CRD and the node access manifest; the CRD loosened (an older or
        edited CRD: `spec.config` kept as written) so a config only the agent refuses (a static
        field, a typo) reaches it, as in tests/process/test_dynconfig.py."""
        async with client_for(self.apiserver, "admin") as admin:
            await install_nodeagentconfig_crd(admin)
            await apply_manifest(admin, NAC_ACCESS)
            await loosen_nodeagentconfig_crd(admin)
            await install_cnr_crd(admin)
            for node in NODES:
                async with client_for(self.apiserver, node) as node_client:
                    await install_cnr_node_access(admin, node_client, node)

    def add_plugin(self, node: str, driver: str, devices: list[dict[str, Any]]) -> Plugin:
        inv = self.dir / f"inventory-{node}-{driver}.json"
        plugin = Plugin(node, driver, self.registries[node], inv)
        plugin.set_inventory(devices)
        plugin.start()
        self.plugins.append(plugin)
        return plugin

    def add_reporter(self, node: str, name: str, tag: str) -> Plugin:
        path = self.dir / f"report-{node}-{name}.json"
        reporter = Plugin(node, name, self.registries[node], path, kind="reporter")
        reporter.set_inventory(report(name, tag))
        reporter.start()
        self.reporters.append(reporter)
        return reporter

    def start_agent(self, node: str) -> Agent:
        agent = Agent(self, node)
        self.agents[node] = agent
        agent.wait_ready()
        return agent

    # -- the cluster, as admin ---------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return self.apiserver.request(method, path, body)
        except (
            OSError,
            ValueError,
            http.client.HTTPException,
        ) as exc:  # refused, reset, half a body
            raise ApiDown(f"{method} {path}: {exc}") from exc

    def ensure_node(self, node: str) -> None:
        status, body = self.admin("GET", f"/api/v1/nodes/{node}")
        if status == 404:
            status, body = self.admin(
                "POST",
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
            )
        if status not in (200, 201):
            raise RuntimeError(f"Node {node}: {status} {body}")

    def slices(self) -> list[dict[str, Any]]:
        status, body = self.admin("GET", SLICES_PATH)
        if status != 200:
            raise ApiDown(f"list resourceslices: {status}")
        items: list[dict[str, Any]] = body["items"]
        return items

    def checkpoints(self, node: str) -> Path:
        """The node's checkpoint directory (the agent creates it at its first start)."""
        return self.dir / f"state-{node}" / "checkpoints"

    def set_read_only(self, node: str, read_only: bool) -> None:
        """The node's checkpoint directory made read-only (a read-only bind mount over itself,
        as tests/process/test_state_dir.py does: root ignores permission bits) or writable again
        (the mount removed). In the soak's own mount namespace: every agent started meanwhile
        sees it too."""
        path = str(self.checkpoints(node))
        if read_only:
            subprocess.run(["mount", "--bind", "-o", "ro", path, path], check=True)
            self.read_only.add(node)
        else:
            subprocess.run(["umount", path], check=True)
            self.read_only.discard(node)

    def faulty(self) -> bool:
        """Whether a node's state directory cannot be written (read-only or full)."""
        return bool(self.read_only or self.full)

    def _mount_small_disk(self, node: str) -> None:
        """The node's state directory on a file system of its own, a small tmpfs (root only,
        as the read-only bind mount; elsewhere a plain directory and `state_full` never
        applies), so that filling it fills only the agent's disk."""
        path = self.dir / f"state-{node}"
        path.mkdir(exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            return
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], check=True)
        self.small_disk.add(node)

    def set_full(self, node: str, full: bool) -> None:
        """The node's state file system filled to the last byte by a file of its own (another
        program's, as far as the agent knows: its writes fail with ENOSPC, No space left on
        device), or that file removed."""
        filler = self.dir / f"state-{node}" / "soak-filler"
        if full:
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # unbuffered
            try:
                for chunk in (1 << 20, 4096, 1):  # down to the last byte of the last page
                    try:
                        while True:
                            os.write(fd, bytes(chunk))
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
            finally:
                os.close(fd)
            self.full.add(node)
        else:
            filler.unlink(missing_ok=True)
            self.full.discard(node)

    def cnr_annotations(self, node: str) -> dict[str, str]:
        """The annotations of the node's CustomNodeResource (none while it does not exist)."""
        status, body = self.admin("GET", f"{CNR_PATH}/{node}")
        if status == 404:
            return {}
        if status != 200:
            raise ApiDown(f"get CNR {node}: {status}")
        return dict(body["metadata"].get("annotations") or {})

    def node(self, node: str) -> tuple[str, dict[str, Any] | None]:
        """The Node's UID and its NodeAgentConfigOK condition (None: not written)."""
        status, body = self.admin("GET", f"/api/v1/nodes/{node}")
        if status != 200:
            raise ApiDown(f"get Node {node}: {status}")
        uid: str = body["metadata"]["uid"]
        for c in (body.get("status") or {}).get("conditions") or []:
            if c["type"] == "NodeAgentConfigOK":
                return uid, dict(c)
        return uid, None

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(signal.SIGKILL)
        for node in list(self.read_only):
            self.set_read_only(node, False)
        for node in list(self.small_disk):
            subprocess.run(["umount", str(self.dir / f"state-{node}")], check=False)
        for plugin in [*self.plugins, *self.reporters]:
            plugin.stop()
        self.proxy.close()
        self.apiserver.close()
        for registry in self.registries.values():
            shutil.rmtree(registry, ignore_errors=True)
