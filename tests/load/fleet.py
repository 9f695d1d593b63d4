"""A fleet of `nodeagent run` processes against one real kube-apiserver, each with its own node
identity (a `system:node:<name>` client certificate minted by the harness), Node object, state
directory, plugin registry and DRA plugin process (examples/dra_device_plugin.py); and the
apiserver's audit log, which counts every request the agents make, by identity.

Used by `python -m tests.load.agents` (the measurement) and tests/load/test_load_agents.py (a
small fleet in CI). Standard library plus the harness; no psutil (RSS and sockets come from
/proc)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import trio

from nodeagent.kube import NODES, KubeClient, errors, load_kubeconfig
from tests.support.apiserver import ApiServer, free_ports, start_apiserver
from tests.support.crds import REPO_ROOT, apply_manifest, install_cnr_crd
from tests.support.nodeagentconfig import install_nodeagentconfig_crd

PLUGIN = REPO_ROOT / "examples" / "dra_device_plugin.py"
ACCESS = (
    REPO_ROOT / "deploy" / "kubernetes" / "cnr-node-access.yaml",
    REPO_ROOT / "deploy" / "kubernetes" / "nodeagentconfig-node-access.yaml",
)
NODE_USER = "system:node:"

# Every request when its response is complete, and a watch also when it starts (an apiserver
# killed while a watch is open never logs its completion), with its metadata.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""


def node_names(n: int) -> list[str]:
    return [f"load-{i:03d}" for i in range(n)]


def start_audited_apiserver(workdir: pathlib.Path, nodes: Iterable[str]) -> ApiServer:
    """The harness with a certificate per node and an audit log of every request."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return start_apiserver(
        workdir,
        nodes=tuple(nodes),
        extra_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ],
    )


def audit_log(srv: ApiServer) -> pathlib.Path:
    return srv.dir / "audit.log"


# --------------------------------------------------------------------------------------------
# the cluster side: CRDs, node access, Node objects


def _client(srv: ApiServer, identity: str) -> KubeClient:
    return KubeClient(load_kubeconfig(str(srv.kubeconfig(identity))), qps=500.0, burst=1000)


async def _prepare(
    srv: ApiServer, nodes: list[str], labels: Mapping[str, Mapping[str, str]]
) -> None:
    async with _client(srv, "admin") as admin:
        await install_cnr_crd(admin)
        await install_nodeagentconfig_crd(admin)
        for manifest in ACCESS:
            await apply_manifest(admin, manifest)
        for name in nodes:
            meta = {"name": name, "labels": dict(labels.get(name, {}))}
            with contextlib.suppress(errors.AlreadyExists):
                await admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": meta})


def prepare_cluster(
    srv: ApiServer, nodes: list[str], labels: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """What an operator installs (the CRDs and node access manifests from deploy/), and one Node
    per agent (with ``labels[node]``), as the kubelet would have registered it."""
    trio.run(_prepare, srv, nodes, labels or {})


# --------------------------------------------------------------------------------------------
# the agents


@dataclass
class Agent:
    node: str
    root: pathlib.Path
    port: int
    agent: subprocess.Popen[bytes] | None = None
    plugin: subprocess.Popen[bytes] | None = None

    @property
    def registry(self) -> pathlib.Path:
        return self.root / "reg"

    def readyz(self, timeout: float = 2.0) -> bool:
        return self.readyz_reason(timeout) is None

    def readyz_reason(self, timeout: float = 2.0) -> str | None:
        """None when ready, else why not: the failing components' lines of /readyz."""
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return None if resp.status == 200 else f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            lines = [ln for ln in body.splitlines() if ln.startswith("[-]")]
            return "; ".join(lines) or f"HTTP {exc.code}"
        except (OSError, urllib.error.URLError) as exc:
            return f"no answer: {exc}"

    def metrics(self, timeout: float = 5.0) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.read().decode())


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env


@dataclass
class Fleet:
    """N agents, each with a plugin; started in batches (the machine has 2 cores)."""

    srv: ApiServer
    nodes: list[str]
    settings: list[str] = field(default_factory=list)  # extra `--set SECTION.KEY=VALUE`
    devices: int = 4
    # A DRA plugin process beside each agent (the load measurement); off: the agents alone.
    plugins: bool = True
    # node -> "table.field=VALUE": that node's agent runs under the test-only launcher
    # tests.support.unready_agent, not ready while its config's field has that value (a config
    # that fails its trial on those nodes only).
    unready_when: dict[str, str] = field(default_factory=dict)
    agents: list[Agent] = field(default_factory=list)
    base: pathlib.Path = field(init=False)

    def __post_init__(self) -> None:
        # Unix socket paths are limited to 107 bytes: keep the registries short, under /tmp.
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="na-load-", dir="/tmp"))
        ports = free_ports(len(self.nodes))
        self.agents = [
            Agent(n, self.base / str(i), p)
            for i, (n, p) in enumerate(zip(self.nodes, ports, strict=True))
        ]

    def _start_one(self, a: Agent) -> None:
        a.registry.mkdir(parents=True)
        log = open(a.root / "agent.log", "wb")  # noqa: SIM115 - owned by the child
        sets = [arg for s in self.settings for arg in ("--set", s)]
        env = _env()
        module = "nodeagent"
        if a.node in self.unready_when:
            module = "tests.support.unready_agent"
            env["NODEAGENT_TEST_UNREADY_WHEN"] = self.unready_when[a.node]
        a.agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "run",
                "--kubeconfig",
                str(self.srv.kubeconfig(a.node)),
                "--node-name",
                a.node,
                "--state-dir",
                str(a.root / "state"),
                "--registry-dir",
                str(a.registry),
                "--ops-address",
                f"127.0.0.1:{a.port}",
                "--log-level",
                "warning",
                *sets,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,  # the launcher is a module of the repository's tests
        )
        log.close()
        if not self.plugins:
            return
        plog = open(a.root / "plugin.log", "wb")  # noqa: SIM115 - owned by the child
        a.plugin = subprocess.Popen(
            [
                sys.executable,
                str(PLUGIN),
                "--registry-dir",
                str(a.registry),
                "--devices",
                str(self.devices),
            ],
            env={**_env(), "NODE_NAME": a.node},
            stdin=subprocess.DEVNULL,
            stdout=plog,
            stderr=subprocess.STDOUT,
        )
        plog.close()

    def start(self, batch: int = 10, timeout: float = 120.0) -> float:
        """Start every agent and its plugin, ``batch`` at a time, each batch ready (/readyz)
        before the next; returns the seconds it took."""
        t0 = time.monotonic()
        for i in range(0, len(self.agents), batch):
            group = self.agents[i : i + batch]
            for a in group:
                self._start_one(a)
            self.wait_ready(group, timeout)
        return time.monotonic() - t0

    def wait_ready(self, agents: list[Agent] | None = None, timeout: float = 120.0) -> float:
        """Poll /readyz until every agent answers 200; returns the seconds it took."""
        t0 = time.monotonic()
        waiting = list(agents if agents is not None else self.agents)
        while waiting:
            for a in waiting:
                if a.agent is not None and a.agent.poll() is not None:
                    tail = (a.root / "agent.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"agent {a.node} exited with {a.agent.returncode}: {tail}")
            waiting = [a for a in waiting if not a.readyz()]
            if not waiting:
                break
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"not ready after {timeout:.0f}s: {[a.node for a in waiting]}")
            time.sleep(0.5)
        return time.monotonic() - t0

    def pids(self) -> Iterator[tuple[Agent, int, int]]:
        for a in self.agents:
            if a.agent is not None and a.plugin is not None:
                yield a, a.agent.pid, a.plugin.pid

    def stop(self) -> None:
        """SIGTERM every process this fleet started (by pid), then SIGKILL what remains."""
        procs = [p for a in self.agents for p in (a.agent, a.plugin) if p is not None]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# measuring: /proc and the audit log


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _established_to(port: int) -> dict[str, int]:
    """inode -> 1 for every ESTABLISHED TCP connection to 127.0.0.1:``port``."""
    found: dict[str, int] = {}
    want = f"0100007F:{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[2].endswith(want[-13:]) and cols[3] == "01":
                    found[cols[9]] = 1
    return found


def connections_to(pids: Iterable[int], port: int) -> list[int]:
    """For each pid, its established TCP connections to the apiserver's port."""
    established = _established_to(port)
    return [sum(1 for i in _socket_inodes(pid) if i in established) for pid in pids]


@dataclass(frozen=True, slots=True)
class Request:
    user: str
    verb: str
    resource: str
    uri: str
    code: int
    received: float  # epoch seconds
    completed: float | None  # None: still open when the log ends (a watch of a killed server)


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def read_audit(path: pathlib.Path) -> list[Request]:
    """The agents' requests (node identities only) from the apiserver's audit log, one per
    request (a watch's ResponseStarted and ResponseComplete records merged)."""
    found: dict[str, Request] = {}
    with open(path, "rb") as f:
        for raw in f:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue  # a line cut by a kill: the apiserver writes whole lines otherwise
            user = ev.get("user", {}).get("username", "")
            if not user.startswith(NODE_USER):
                continue
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource", "") or ev.get("requestURI", "").split("?")[0]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            done = ev.get("stage") != "ResponseStarted"
            req = Request(
                user=user[len(NODE_USER) :],
                verb=ev.get("verb", ""),
                resource=resource,
                uri=ev.get("requestURI", ""),
                code=int((ev.get("responseStatus") or {}).get("code", 0)),
                received=_epoch(ev["requestReceivedTimestamp"]),
                completed=_epoch(ev["stageTimestamp"]) if done else None,
            )
            if done or ev["auditID"] not in found:
                found[ev["auditID"]] = req
    return sorted(found.values(), key=lambda r: r.received)


def open_at(r: Request, t: float) -> bool:
    """A watch that was open (and accepted) at time ``t``."""
    return (
        r.verb == "watch"
        and r.code < 400
        and r.received <= t
        and (r.completed is None or r.completed > t)
    )


def is_list(r: Request) -> bool:
    """A full list the server accepted: a LIST, or a watch that streams its initial events
    (refused attempts, e.g. 403 or 429 while a restarted apiserver warms up, are errors)."""
    if r.code >= 400:
        return False
    return r.verb == "list" or (r.verb == "watch" and "sendInitialEvents=true" in r.uri)


def apiserver_watches(srv: ApiServer) -> float:
    """Watches open on the apiserver now (its apiserver_longrunning_requests gauge)."""
    status, body = srv.request("GET", "/metrics", timeout=30)
    if status != 200 or not isinstance(body, str):
        raise RuntimeError(f"/metrics -> {status}")
    total = 0.0
    for line in body.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_sum(text: str, name: str, skip: str = "\0") -> float:
    """The sum of every series of metric ``name`` in a /metrics text, but those whose labels
    contain ``skip``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and skip not in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def agent_counts(agent: Agent) -> dict[str, float]:
    """What the agent counted itself: requests answered (nodeagent_api_requests_total, every
    code but "error", i.e. no answer), full lists (nodeagent_watch_relists_total) and watch
    ends by reason, to check the audit log's accounting against."""
    text = agent.metrics()
    out = {
        "requests": metric_sum(text, "nodeagent_api_requests_total", 'code="error"'),
        "lists": metric_sum(text, "nodeagent_watch_relists_total"),
    }
    for line in text.splitlines():
        if line.startswith("nodeagent_watch_restarts_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[f"watch_end_{reason}"] = out.get(f"watch_end_{reason}", 0) + float(
                line.rsplit(" ", 1)[1]
            )
    return out
