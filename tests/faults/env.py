"""The world a fault scenario runs in: one real apiserver (with an audit log that counts the
agent's requests), a pass-through and a TLS-terminating `FaultProxy` in front of it, a DRA plugin
process whose inventory a test rewrites, and `nodeagent run` as a subprocess with node-a's
credentials in files (so they can be rotated).

Plain Python (no pytest), so `python -m tests.faults.matrix` and the pytest subset share it.

The expectation is computed independently of the agent: from the plugin's current inventory
with the documented native-API mapping (devices one to one, one pool named after the node,
slices of at most 128 devices in order) and the current Node's UID as the controller owner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from tests.integration.conftest import client_for
from tests.process.conftest import NotifyListener, nodeagent_command
from tests.support.apiserver import ApiServer, start_apiserver
from tests.support.crds import REPO_ROOT, apply_manifest, install_cnr_crd, install_cnr_node_access
from tests.support.faultproxy import FaultProxy
from tests.support.file_plugin import command
from tests.support.nodeagentconfig import install_nodeagentconfig_crd
from tests.support.wait import until

NODE = "node-a"
DRIVER = "gpu.example.com"
SLICE_MAX = 128

# Every request of the identities the agent runs as, at Metadata level (no bodies).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]  # ResponseStarted: a watch is seen when it opens
rules:
- level: Metadata
  users: ["system:node:node-a", "token-user"]
- level: None
"""

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
CNR_PATH = f"/apis/node.katalyst.kubewharf.io/v1alpha1/customnoderesources/{NODE}"
NAC_NODE_ACCESS = REPO_ROOT / "deploy" / "kubernetes" / "nodeagentconfig-node-access.yaml"
# No NodeAgentConfig targets the node: the documented condition (docs: Dynamic configuration),
# once the objects are read (at boot it says "running the local config: no checkpoint").
CONDITION = ("NodeAgentConfigOK", "True", "Local", "no NodeAgentConfig targets the node")


def inventory(n: int, tag: str = "a") -> list[dict[str, Any]]:
    """n devices; ``tag`` changes every device's attributes (a new inventory of the same size)."""
    return [
        {
            "name": f"gpu-{i}",
            "attributes": {"index": i, "model": f"A100-{tag}"},
            "capacity": {"memory": "40Gi"},
        }
        for i in range(n)
    ]


def _v1_device(d: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, value in d["attributes"].items():
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
        attrs[key] = {kind: value}
    caps = {k: {"value": v} for k, v in d["capacity"].items()}
    return {"name": d["name"], "attributes": attrs, "capacity": caps}


def _covers(want: Any, have: Any) -> bool:
    """Everything in ``want`` is in ``have`` (which may hold more: fields the CRD defaults,
    such as ``status.topologyPolicy``); lists element by element."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_covers(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(_covers(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


@dataclass
class Diff:
    """Observed slices against the expectation."""

    lost: int  # expected devices missing or differing, + 1 for a wrong CNR or Node condition
    duplicated: int  # devices present more than once, or slices beyond the expected count
    wrong: list[str]  # what else differs (owner, pool count, obsolete generations, labels)

    @property
    def equal(self) -> bool:
        return not self.lost and not self.duplicated and not self.wrong


class Agent:
    """`nodeagent run` as a subprocess; stderr goes to a file (a pipe could fill and block)."""

    def __init__(self, env: FaultEnv, args: Sequence[str]) -> None:
        env.agent_runs += 1
        self.notify = NotifyListener(env.dir / f"notify-{env.agent_runs}")
        self.log = env.dir / f"agent-{env.agent_runs}.log"
        self.ops = ""
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                nodeagent_command(*args),
                env=env.agent_environ(self.notify.path),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        fields = self.notify.wait_for("READY", timeout=timeout)
        self.ops = fields["STATUS"].split("ops on ", 1)[1].split()[0]

    def get(self, path: str, timeout: float = 5) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.ops}{path}", timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.notify.close()

    def stop(self) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.notify.close()


@dataclass
class FaultEnv:
    """One apiserver + proxies for many scenarios; `case()` gives each a fresh agent, plugin
    and state directory."""

    dir: Path
    apiserver: ApiServer
    passthrough: FaultProxy
    terminating: FaultProxy
    audit_log: Path
    agent_runs: int = 0
    # per case
    registry: str = ""
    state_dir: Path = field(default_factory=Path)
    inventory_file: Path = field(default_factory=Path)
    devices: list[dict[str, Any]] = field(default_factory=list)
    plugin: subprocess.Popen[bytes] | None = None
    agent: Agent | None = None
    creds: Path = field(default_factory=Path)
    kubeconfig: Path = field(default_factory=Path)
    token_auth: bool = False
    cleanups: list[Callable[[], object]] = field(default_factory=list)
    # The CNR's spec and status as a fresh standalone agent on this machine merges them.
    cnr_expected: dict[str, Any] = field(default_factory=dict)
    cnr_expected_at: float = 0.0

    @classmethod
    @contextmanager
    def start(cls, workdir: Path) -> Iterator[FaultEnv]:
        workdir.mkdir(parents=True, exist_ok=True)
        policy = workdir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit = workdir / "audit.log"
        apiserver = start_apiserver(
            workdir / "apiserver",
            extra_args=[
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit}",
                "--audit-log-mode=blocking",
                "--audit-log-format=json",
            ],
        )
        try:
            with (
                FaultProxy(apiserver) as passthrough,
                FaultProxy(apiserver, terminate_tls=True) as terminating,
            ):
                env = cls(workdir, apiserver, passthrough, terminating, audit)
                trio.run(env._install_cnr)
                env.cnr_expected = env._fresh_cnr()
                env.cnr_expected_at = time.monotonic()
                yield env
        finally:
            apiserver.close()

    async def _install_cnr(self) -> None:
        """The shipped CRDs and node access manifests: node-a may write its own CNR and read
        NodeAgentConfigs (none exist: its dynamic-config condition says `Local`)."""
        async with (
            client_for(self.apiserver, "admin") as admin,
            client_for(self.apiserver, NODE) as node,
        ):
            await install_cnr_crd(admin)
            await install_cnr_node_access(admin, node, NODE)
            await install_nodeagentconfig_crd(admin)
            await apply_manifest(admin, NAC_NODE_ACCESS)

    def _fresh_cnr(self) -> dict[str, Any]:
        """The CNR a fresh standalone agent merges (the system reporter, no plugins): what the
        cluster's copy must equal after every fault."""
        scratch = Path(tempfile.mkdtemp(prefix="fresh-", dir=self.dir))
        registry = tempfile.mkdtemp(prefix="na-fr-", dir="/tmp")
        agent = Agent(
            self,
            [
                "run",
                "--node-name",
                NODE,
                "--registry-dir",
                registry,
                "--state-dir",
                str(scratch / "state"),
                "--ops-address",
                "127.0.0.1:0",
            ],
        )
        try:
            agent.wait_ready()

            def merged() -> dict[str, Any] | None:
                doc = json.loads(agent.get("/v1/cnr")[1])
                cnr = doc.get("cnr") or {}
                ok = "system-reporter-plugin" in doc["plugins"] and cnr.get("spec")
                return {k: cnr.get(k) for k in ("spec", "status")} if ok else None

            return until(merged, "the fresh agent's CNR", timeout=60)
        finally:
            agent.stop()
            shutil.rmtree(registry, ignore_errors=True)

    # -- the cluster --------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.apiserver.request(method, path, body)

    def ensure_node(self) -> str:
        status, node = self.admin("GET", f"/api/v1/nodes/{NODE}")
        if status == 404:
            status, node = self.admin(
                "POST",
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}},
            )
        assert status in (200, 201), node
        uid: str = node["metadata"]["uid"]
        return uid

    def node_uid(self) -> str | None:
        status, node = self.admin("GET", f"/api/v1/nodes/{NODE}")
        return node["metadata"]["uid"] if status == 200 else None

    def slices(self) -> list[dict[str, Any]]:
        status, body = self.admin(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}"
        )
        assert status == 200, body
        items: list[dict[str, Any]] = body["items"]
        return items

    def delete_slices(self) -> None:
        status, body = self.admin(
            "DELETE",
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}",
        )
        assert status == 200, body

    def diff(self) -> Diff:
        """The node's slices in the cluster against a fresh computation from the plugin's
        current inventory."""
        expected = [_v1_device(d) for d in self.devices]
        want_slices = (len(expected) + SLICE_MAX - 1) // SLICE_MAX
        observed = self.slices()
        wrong: list[str] = []
        seen: dict[str, int] = {}
        got: dict[str, dict[str, Any]] = {}
        status, node = self.admin("GET", f"/api/v1/nodes/{NODE}")
        uid = node["metadata"]["uid"] if status == 200 else None
        conditions = (node.get("status") or {}).get("conditions") or [] if status == 200 else []
        ours = [
            (c["type"], c["status"], c["reason"], c.get("message", "").split(";")[0])
            for c in conditions
            if c["type"] == CONDITION[0]
        ]
        condition_lost = ours != [CONDITION]
        if condition_lost:
            wrong.append(f"Node condition {ours} != {[CONDITION]}")
        gens = {s["spec"]["pool"]["generation"] for s in observed}
        if len(gens) > 1:
            wrong.append(f"generations {sorted(gens)}")
        for s in observed:
            spec = s["spec"]
            if spec["driver"] != DRIVER or spec["pool"]["name"] != NODE:
                wrong.append(f"slice {s['metadata']['name']} of {spec['driver']}/{spec['pool']}")
                continue
            if spec["pool"]["resourceSliceCount"] != want_slices:
                wrong.append(f"resourceSliceCount {spec['pool']['resourceSliceCount']}")
            owners = s["metadata"].get("ownerReferences", [])
            if [(o["kind"], o["uid"]) for o in owners] != [("Node", uid)]:
                wrong.append(f"owner {[(o['kind'], o['uid']) for o in owners]} != Node {uid}")
            if s["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") != "nodeagent":
                wrong.append(f"slice {s['metadata']['name']} without the managed-by label")
            for d in spec.get("devices", []):
                seen[d["name"]] = seen.get(d["name"], 0) + 1
                got[d["name"]] = {
                    "name": d["name"],
                    "attributes": d.get("attributes", {}),
                    "capacity": d.get("capacity", {}),
                }
        lost = sum(1 for d in expected if got.get(d["name"]) != d) + condition_lost
        extra_names = set(got) - {d["name"] for d in expected}
        duplicated = sum(n - 1 for n in seen.values()) + max(0, len(observed) - want_slices)
        if extra_names:
            wrong.append(f"devices not in the inventory: {sorted(extra_names)[:5]}")
        status, cnr = self.admin("GET", CNR_PATH)
        # This machine's NUMA MemTotal drifts (a VM balloon): compute afresh, at most every
        # 10 s, before calling the cluster's copy wrong.
        stale = time.monotonic() - self.cnr_expected_at > 10
        if status == 200 and stale and not _covers(self.cnr_expected, cnr):
            self.cnr_expected = self._fresh_cnr()
            self.cnr_expected_at = time.monotonic()
        if status != 200 or not _covers(self.cnr_expected, cnr):
            lost += 1
            wrong.append(f"the CNR differs from a fresh agent's (GET {status})")
        return Diff(lost, duplicated, sorted(set(wrong)))

    # -- the audit log ------------------------------------------------------

    def audit_mark(self) -> float:
        """Now, for `audit_events`: requests are counted by when the apiserver received them
        (a watch is logged when it ends, long after it began)."""
        return time.time()

    def audit_events(self, since: float) -> list[dict[str, Any]]:
        if not self.audit_log.exists():
            return []
        out = []
        for line in self.audit_log.read_bytes().splitlines():
            try:
                event = json.loads(line)
                received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            except (ValueError, KeyError):
                continue  # a line cut by an apiserver crash
            if received >= since:
                out.append(event)
        return out

    def slice_writes(self, since: float) -> int:
        """Write requests the agent's identities sent for ResourceSlices since the mark."""
        return sum(
            1
            for e in self.audit_events(since)
            if e.get("verb") in WRITE_VERBS
            and e.get("stage") == "ResponseComplete"
            and e.get("objectRef", {}).get("resource") == "resourceslices"
            # The publisher's dry runs before a new pool generation store nothing.
            and "dryRun=" not in e.get("requestURI", "")
        )

    def other_writes(self, since: float) -> int:
        """Writes of the CNR and of the Node's status (the dynamic-config condition)."""
        return sum(
            1
            for e in self.audit_events(since)
            if e.get("verb") in WRITE_VERBS
            and e.get("stage") == "ResponseComplete"
            and (
                e.get("objectRef", {}).get("resource") == "customnoderesources"
                or (
                    e.get("objectRef", {}).get("resource") == "nodes"
                    and e.get("objectRef", {}).get("subresource") == "status"
                )
            )
        )

    def lists(self, since: float) -> int:
        """Full reads the agent made since the mark: LISTs and streaming lists (a watch with
        ``sendInitialEvents=true``)."""
        return sum(
            1
            for e in self.audit_events(since)
            if (e.get("verb") == "list" and e.get("stage") == "ResponseComplete")
            or (
                e.get("verb") == "watch"
                and e.get("stage") == "ResponseStarted"
                and "sendInitialEvents=true" in e.get("requestURI", "")
            )
        )

    # -- a case -------------------------------------------------------------

    def begin(self, devices: list[dict[str, Any]], *, token: bool = False) -> None:
        """A fresh case: the Node, no slices, a plugin serving ``devices``, credentials."""
        self.ensure_node()
        self.delete_slices()
        self.registry = tempfile.mkdtemp(prefix="na-f-", dir="/tmp")  # short socket paths
        case = Path(tempfile.mkdtemp(prefix="case-", dir=self.dir))
        self.state_dir = case / "state"
        self.inventory_file = case / "inventory.json"
        self.creds = case / "creds"
        self.creds.mkdir()
        crt, key = self.apiserver.cert_files(NODE)
        shutil.copy(crt, self.creds / "client.crt")
        shutil.copy(key, self.creds / "client.key")
        (self.creds / "token").write_text(self.apiserver.token("token-a") + "\n")
        self.kubeconfig = case / "kubeconfig.json"
        self.token_auth = token
        self.set_inventory(devices)
        self.start_plugin()

    def write_kubeconfig(self, proxy: FaultProxy | None) -> Path:
        server = proxy.url if proxy is not None else self.apiserver.url
        user: dict[str, str]
        if self.token_auth:
            user = {"tokenFile": str(self.creds / "token")}
        else:
            user = {
                "client-certificate": str(self.creds / "client.crt"),
                "client-key": str(self.creds / "client.key"),
            }
        return self.apiserver.write_kubeconfig(self.kubeconfig, user, server)

    def set_inventory(
        self, devices: list[dict[str, Any]], *, flood: int = 0, valid: bool = True
    ) -> None:
        """What the plugin publishes next (it watches the file); with ``flood``, preceded by
        that many distinct inventories back to back. An invalid inventory is rejected by the
        agent, so the expectation stays the last valid one."""
        if valid:
            self.devices = devices
        if flood:
            self.inventory_file.with_suffix(".json.flood").write_text(str(flood))
        tmp = self.inventory_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(devices))
        os.replace(tmp, self.inventory_file)

    def start_plugin(self) -> None:
        self.plugin = subprocess.Popen(
            command("dra", self.registry, self.inventory_file, DRIVER, pool=NODE),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start_second_plugin(self, devices: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
        """A second live instance of the same driver (another registration socket in the
        registry, its own service socket and inventory)."""
        private = tempfile.mkdtemp(prefix="na-f2-", dir="/tmp")
        inv = Path(private) / "inventory.json"
        inv.write_text(json.dumps(devices))
        sock = Path(self.registry) / f"{DRIVER}-second-reg.sock"
        proc = subprocess.Popen(
            command("dra", private, inv, DRIVER, pool=NODE, register_as=str(sock)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def stop() -> None:
            proc.kill()
            proc.wait(30)
            shutil.rmtree(private, ignore_errors=True)

        self.cleanups.append(stop)
        return proc

    def kill_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.kill()
            self.plugin.wait(30)
            self.plugin = None

    def agent_environ(self, notify: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env["NOTIFY_SOCKET"] = notify
        return env

    def start_agent(self, *settings: str, ready: bool = True) -> Agent:
        args = [
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node-name",
            NODE,
            "--registry-dir",
            self.registry,
            "--state-dir",
            str(self.state_dir),
            "--ops-address",
            "127.0.0.1:0",
        ]
        for s in settings:
            args += ["--set", s]
        self.agent = Agent(self, args)
        if ready:
            self.agent.wait_ready()
        return self.agent

    def plugin_registered(self) -> bool:
        """Whether the agent's /v1/plugins shows the DRA plugin registered."""
        assert self.agent is not None
        plugins = json.loads(self.agent.get("/v1/plugins")[1])
        return any(p["name"] == DRIVER and p["state"] == "registered" for p in plugins)

    def ready(self) -> bool:
        return self.agent is not None and self.agent.alive() and self.agent.get("/readyz")[0] == 200

    def settled(self, timeout: float = 60) -> float:
        """Wait until the cluster equals the expectation and the agent is ready; return when
        (monotonic)."""
        until(
            lambda: self.diff().equal and self.ready(),
            "the slices to equal the plugin's inventory and the agent to be ready",
            timeout=timeout,
        )
        return time.monotonic()

    def end(self) -> None:
        if self.agent is not None:
            self.agent.kill()
            self.agent = None
        self.kill_plugin()
        while self.cleanups:
            self.cleanups.pop()()
        shutil.rmtree(self.registry, ignore_errors=True)
        self.passthrough.clear()
        self.terminating.clear()
