"""A configuration rollout through a fleet of real agents and the real rollout controller: N
`nodeagent run` processes (tests/load/fleet.py, node identities, short trials) and one or more
`nodeagent rollout-controller` processes against one real kube-apiserver, with a recorder that
watches the Nodes and NodeAgentConfigs and keeps every NodeAgentConfigOK condition change and
every status.rollout the test sees, timestamped. What the rollout did is judged from that record:
the peak of nodes on trial at once, which nodes ever tried a config, whether a status ever
admitted fewer nodes than before.

Used by tests/load/test_load_rollout.py (a small fleet in CI) and, for the figures of a large
one (docs/testing/load.md)::

    python -m tests.load.rollout --agents 100

which rolls a good config out through a canary and 4 waves and prints the time it took and the
peak on trial against maxUnavailable. Heavy: one process per agent; run it once on a shared
machine, not in a loop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from nodeagent.kube import NODES, KubeClient, load_kubeconfig
from nodeagent.kube.watch import WatchRequest, run_watch
from nodeagent.rollout.api import ALL, NONE, RolloutStatus, decode_status
from nodeagent.rollout.plan import NodeState
from nodeagent.rollout.rank import rank_key
from nodeagent.rollout_controller.observe import CONDITION_TYPE, node_state
from tests.load.fleet import Fleet, node_names, prepare_cluster, start_audited_apiserver
from tests.support.apiserver import ApiServer, free_ports
from tests.support.crds import REPO_ROOT
from tests.support.nodeagentconfig import NAC, nodeagentconfig
from tests.support.wait import NotYet, until
from tests.support.watch import EventSink

POOL = {"pool": "fleet"}
CANARY_LABEL = "rollout.example.com/canary"
# Trials of 3 s, checked every 0.5 s, a component unready for 1 s fails one: waves move quickly.
TRIAL = [
    "dynconfig.trial_duration=3.0",
    "dynconfig.health_interval=0.5",
    "dynconfig.unready_bound=1.0",
]
# The config that fails its trial on the nodes started with this hook (Fleet.unready_when).
BAD_FIELD, BAD_VALUE = "plugins.scan_interval", 0.77
# The controllers' Lease, short: a killed leader is replaced within seconds; but a leader may
# stall a few seconds on a loaded 2-core machine without losing it.
LEASE = ["--lease-duration", "8", "--renew-deadline", "6", "--retry-period", "1"]
NAME = "fleet"


@dataclass(frozen=True, slots=True)
class Seen:
    """One NodeAgentConfigOK condition of a node, as first seen at ``t`` (monotonic seconds)."""

    t: float
    node: str
    reason: str
    message: str

    def state(self, name: str, config_hash: str) -> NodeState:
        """What the node does with that config: the controller's own reading of the condition."""
        return node_state({"reason": self.reason, "message": self.message}, name, config_hash)


@dataclass(frozen=True, slots=True)
class StatusSeen:
    t: float
    generation: int
    uid: str
    rollout: RolloutStatus


class _Sink(EventSink):
    def __init__(self, on_event: Callable[[str, dict[str, Any]], None]) -> None:
        super().__init__()
        self._on = on_event

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        self._on(type, obj)


@dataclass
class Recorder:
    """Watches Nodes and NodeAgentConfigs (as admin) in a thread of its own and keeps every
    change of a node's NodeAgentConfigOK condition and of an object's status.rollout."""

    srv: ApiServer
    conditions: list[Seen] = field(default_factory=list)
    statuses: dict[str, list[StatusSeen]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _synced: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _token: trio.lowlevel.TrioToken | None = None
    _scope: trio.CancelScope | None = None
    _last: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _node(self, type: str, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name", "")
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") != CONDITION_TYPE:
                continue
            now = (str(cond.get("reason", "")), str(cond.get("message", "")))
            with self._lock:
                if self._last.get(name) != now:
                    self._last[name] = now
                    self.conditions.append(Seen(time.monotonic(), name, *now))

    def _nac(self, type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata", {})
        status = decode_status((obj.get("status") or {}).get("rollout"))
        if status is None:
            return
        seen = StatusSeen(time.monotonic(), int(meta.get("generation", 0)), meta["uid"], status)
        with self._lock:
            history = self.statuses.setdefault(meta["name"], [])
            if not history or history[-1].rollout != status:
                history.append(seen)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        config = load_kubeconfig(str(self.srv.kubeconfig("admin")))
        synced = [False, False]

        def done(i: int) -> Callable[[], None]:
            def mark() -> None:
                synced[i] = True
                if all(synced):
                    self._synced.set()

            return mark

        async with KubeClient(config, qps=500.0, burst=1000) as client, trio.open_nursery() as n:
            self._scope = n.cancel_scope
            sinks = ((NODES, _Sink(self._node)), (NAC, _Sink(self._nac)))
            for i, (resource, sink) in enumerate(sinks):
                n.start_soon(self._watch, client, WatchRequest(resource), sink, done(i))

    @staticmethod
    async def _watch(
        client: KubeClient, request: WatchRequest, sink: _Sink, synced: Callable[[], None]
    ) -> None:
        await run_watch(client, request, sink, on_synced=synced)

    def start(self) -> Recorder:
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        if not self._synced.wait(60):
            raise TimeoutError("the recorder's watches did not list within 60 s")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._token is not None and self._scope is not None:
            scope = self._scope
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
        self._thread.join(30)

    def now(self) -> dict[str, Seen]:
        """Each node's condition as last seen."""
        with self._lock:
            latest: dict[str, Seen] = {}
            for seen in self.conditions:
                latest[seen.node] = seen
            return latest

    def history(self, name: str = NAME) -> list[StatusSeen]:
        with self._lock:
            return list(self.statuses.get(name, []))

    def status(self, name: str = NAME) -> StatusSeen | None:
        history = self.history(name)
        return history[-1] if history else None


# --------------------------------------------------------------------------------------------
# judging the record


def peak_on_trial(conditions: Sequence[Seen], name: str, config_hash: str) -> int:
    """The most nodes on trial with the config at once, replaying the condition changes."""
    state: dict[str, NodeState] = {}
    peak = 0
    for seen in conditions:
        state[seen.node] = seen.state(name, config_hash)
        peak = max(peak, sum(1 for s in state.values() if s is NodeState.ON_TRIAL))
    return peak


def tried(conditions: Sequence[Seen], name: str, config_hash: str) -> set[str]:
    """Nodes whose condition ever said they run, ran or refused the config."""
    return {s.node for s in conditions if s.state(name, config_hash) is not NodeState.WAITING}


def widest_threshold(history: Sequence[StatusSeen], config_hash: str) -> str:
    """The furthest status.rollout.admittedThrough any status about the config published."""
    widest = NONE
    for seen in history:
        if seen.rollout.config_hash != config_hash:
            continue
        through = seen.rollout.admitted_through
        if through == ALL or widest == ALL:
            widest = ALL
        elif through != NONE and (widest == NONE or through > widest):
            widest = through
    return widest


def inside(node: str, threshold: str, uid: str, generation: int, canary: bool) -> bool:
    if threshold == ALL:
        return True
    return threshold != NONE and rank_key(node, uid, generation, canary) <= threshold


def admissions_went_back(history: Sequence[StatusSeen], config_hash: str) -> list[str]:
    """Statuses of one rollout (same config, same rollout generation, not aborted) that admitted
    fewer nodes than one before them: a controller that admitted anyone twice, or two that
    disagreed."""
    out = []
    best: dict[int, int] = {}
    for seen in history:
        r = seen.rollout
        if r.config_hash != config_hash or r.admitted_through == NONE:
            continue
        if r.admitted < best.get(r.generation, 0):
            out.append(f"admitted {r.admitted} after {best[r.generation]} ({r.message})")
        best[r.generation] = max(best.get(r.generation, 0), r.admitted)
    return out


# --------------------------------------------------------------------------------------------
# the controllers and the object


@dataclass
class Controller:
    """One `nodeagent rollout-controller` process (admin credentials, short Lease)."""

    srv: ApiServer
    identity: str
    root: pathlib.Path
    port: int = field(default_factory=lambda: free_ports(1)[0])
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Controller:
        log = open(self.root / f"{self.identity}.log", "ab")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodeagent",
                "rollout-controller",
                "--kubeconfig",
                str(self.srv.kubeconfig("admin")),
                "--namespace",
                "default",
                "--identity",
                self.identity,
                "--metrics-address",
                f"127.0.0.1:{self.port}",
                "--log-level",
                "info",
                *LEASE,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        log.close()
        return self

    def serving(self) -> bool | NotYet:
        """Its /healthz answers 200 (the process is up and its loop runs)."""
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.root / f"{self.identity}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.identity} exited with {self.proc.returncode}: {log}")
        try:
            url = f"http://127.0.0.1:{self.port}/healthz"
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status == 200 or NotYet(resp.status)
        except OSError as exc:
            return NotYet(str(exc))

    def metrics(self) -> dict[str, float]:
        """Its own counters: status writes (ok), conflicts, leader."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        out = {"writes": 0.0, "conflicts": 0.0, "leader": 0.0}
        for line in text.splitlines():
            if line.startswith('nodeagent_rollout_status_writes_total{result="ok"}'):
                out["writes"] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("nodeagent_rollout_conflicts_total "):
                out["conflicts"] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("nodeagent_rollout_leader "):
                out["leader"] = float(line.rsplit(" ", 1)[1])
        return out

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def leader(controllers: Sequence[Controller]) -> Controller | NotYet:
    """The one controller whose metrics say it leads."""
    leading = []
    for c in controllers:
        if c.proc is None or c.proc.poll() is not None:
            continue
        with contextlib.suppress(OSError):
            if c.metrics()["leader"] == 1:
                leading.append(c)
    return leading[0] if len(leading) == 1 else NotYet([c.identity for c in leading])


def admin_call(srv: ApiServer, fn: Callable[[KubeClient], Any]) -> Any:
    async def go() -> Any:
        config = load_kubeconfig(str(srv.kubeconfig("admin")))
        async with KubeClient(config) as admin:
            return await fn(admin)

    return trio.run(go)


def put_config(srv: ApiServer, config: Mapping[str, Any], rollout: Mapping[str, Any]) -> None:
    """Create or replace the object NAME: the fleet's nodes, ``config``, ``rollout``."""
    spec = {"nodeSelector": {"matchLabels": POOL}, "config": config, "rollout": rollout}

    async def go(admin: KubeClient) -> None:
        from nodeagent.kube import errors

        try:
            current = msgspec.json.decode(await admin.get(NAC, NAME))
        except errors.NotFound:
            await admin.create(NAC, nodeagentconfig(NAME, spec=spec))
            return
        current["spec"] = spec
        await admin.update(NAC, current)

    admin_call(srv, go)


def patch_rollout(srv: ApiServer, **fields: Any) -> None:
    body = {"spec": {"rollout": fields}}

    async def go(admin: KubeClient) -> None:
        await admin.patch(NAC, NAME, body, type="merge")

    admin_call(srv, go)


def events(srv: ApiServer) -> list[dict[str, Any]]:
    """The Events on the object NAME (namespace default: it is cluster-scoped), oldest first."""
    from nodeagent.kube import CORE_EVENTS

    async def go(admin: KubeClient) -> list[dict[str, Any]]:
        listed = await admin.list(CORE_EVENTS, "default")
        return [
            e
            for e in (msgspec.json.decode(item) for item in listed.items)
            if e.get("involvedObject", {}).get("kind") == NAC.kind
            and e["involvedObject"].get("name") == NAME
        ]

    found: list[dict[str, Any]] = admin_call(srv, go)
    return sorted(
        found, key=lambda e: e.get("firstTimestamp") or e["metadata"]["creationTimestamp"]
    )


def config_hash_of(config: Mapping[str, Any]) -> str:
    from nodeagent.dynconfig.overlay import config_hash

    return config_hash(dict(config))


def active_hash(fleet: Fleet, node: str) -> str:
    """The config a node's agent runs, from its own ops endpoint (/v1/config)."""
    (agent,) = [a for a in fleet.agents if a.node == node]
    url = f"http://127.0.0.1:{agent.port}/v1/config"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.loads(resp.read())
    return str(doc["dynamic"]["active"]["hash"])


# --------------------------------------------------------------------------------------------
# the scenario: a fleet, its controllers, a recorder


@dataclass
class Run:
    srv: ApiServer
    fleet: Fleet
    recorder: Recorder
    controllers: list[Controller]
    canary: set[str]

    def wait_phase(self, config_hash: str, phases: set[str], timeout: float) -> StatusSeen:
        def check() -> StatusSeen | NotYet:
            seen = self.recorder.status()
            if seen is None or seen.rollout.config_hash != config_hash:
                return NotYet(seen)
            if str(seen.rollout.phase) not in phases:
                return NotYet(msgspec.to_builtins(seen.rollout))
            return seen

        found: StatusSeen = until(check, f"phase {phases} for {config_hash}", timeout=timeout)
        return found

    def outside(self, config_hash: str) -> set[str]:
        """Nodes that tried the config though no status ever admitted them."""
        history = self.recorder.history()
        widest = widest_threshold(history, config_hash)
        last = [s for s in history if s.rollout.config_hash == config_hash][-1]
        return {
            node
            for node in tried(self.recorder.conditions, NAME, config_hash)
            if not inside(node, widest, last.uid, last.rollout.generation, node in self.canary)
        }


@contextlib.contextmanager
def fleet_run(
    agents: int,
    workdir: pathlib.Path,
    *,
    canary: int = 1,
    bad: Sequence[int] = (),
    controllers: int = 2,
    batch: int = 10,
) -> Iterator[Run]:
    """``agents`` agents on Nodes labelled POOL (the first ``canary`` also CANARY_LABEL; those at
    the indices ``bad`` fail a trial of the bad config), ``controllers`` controller processes,
    and the recorder, all stopped on the way out."""
    nodes = node_names(agents)
    srv = start_audited_apiserver(workdir / "apiserver", nodes)
    labels = {
        n: {**POOL, **({CANARY_LABEL: "true"} if i < canary else {})} for i, n in enumerate(nodes)
    }
    fleet = Fleet(
        srv,
        nodes,
        settings=TRIAL,
        plugins=False,
        unready_when={nodes[i]: f"{BAD_FIELD}={BAD_VALUE}" for i in bad},
    )
    recorder = Recorder(srv)
    procs: list[Controller] = []
    try:
        prepare_cluster(srv, nodes, labels)
        fleet.start(batch)
        recorder.start()
        procs = [Controller(srv, f"ctl-{i}", fleet.base).start() for i in range(controllers)]
        for c in procs:
            until(c.serving, f"{c.identity} serving /healthz", timeout=60)
        yield Run(srv, fleet, recorder, procs, set(nodes[:canary]))
    finally:
        for c in procs:
            c.stop()
        recorder.stop()
        fleet.close()
        srv.close()


# The policy the runs roll out with: a canary, 4 waves, 2 nodes not yet through at once.
ROLLOUT: dict[str, Any] = {
    "canary": {"count": 1, "selector": {"matchLabels": {CANARY_LABEL: "true"}}},
    "waves": [25, 50, 75, 100],
    "maxUnavailable": 2,
    "failurePolicy": {"maxFailures": 2},
}


def rollout_figures(
    run: Run, config: Mapping[str, Any], timeout: float, policy: Mapping[str, Any] = ROLLOUT
) -> dict[str, Any]:
    """Rolls ``config`` out with ``policy`` and waits for Complete: the time, the peak on
    trial."""
    h = config_hash_of(config)
    t0 = time.monotonic()
    put_config(run.srv, config, policy)
    done = run.wait_phase(h, {"Complete"}, timeout)
    history = [s for s in run.recorder.history() if s.rollout.config_hash == h]
    return {
        "agents": len(run.fleet.agents),
        "rollout_s": round(done.t - t0, 1),
        "waves": max(s.rollout.wave for s in history),
        "max_unavailable": policy["maxUnavailable"],
        "peak_on_trial": peak_on_trial(run.recorder.conditions, NAME, h),
        "statuses_seen": len(history),
        "outside_admitted": sorted(run.outside(h)),
    }


def _status_yaml(srv: ApiServer) -> str:
    async def go(admin: KubeClient) -> Any:
        return msgspec.json.decode(await admin.get(NAC, NAME))

    obj = admin_call(srv, go)
    return msgspec.yaml.encode({"status": obj.get("status", {})}).decode()


def _node_lines(run: Run, node: str) -> str:
    """The node's NodeAgentConfigOK condition and what `nodeagent status` prints on it."""
    seen = run.recorder.now()[node]
    (agent,) = [a for a in run.fleet.agents if a.node == node]
    out = subprocess.run(
        [sys.executable, "-m", "nodeagent", "status", "--ops-address", f"127.0.0.1:{agent.port}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    return f"{node} NodeAgentConfigOK: {seen.reason}: {seen.message}\n--- nodeagent status:\n{out}"


def transcript(agents: int, workdir: pathlib.Path, path: pathlib.Path) -> None:
    """What an operator sees at each step of a rollout (docs/operating/rollout.md takes its
    excerpts from this): the object's status, its Events, a node's condition and `nodeagent
    status`, before a controller runs, mid-rollout, paused, complete, halted and aborted."""
    parts: list[str] = []

    def snap(title: str, nodes: Sequence[str]) -> None:
        parts.append(f"===== {title}\n{_status_yaml(run.srv)}")
        for e in events(run.srv):
            parts.append(f"Event {e['type']} {e['reason']}: {e['message']}")
        for node in nodes:
            parts.append(_node_lines(run, node))
        path.write_text("\n".join(parts) + "\n")

    def node_in(reason: str, h: str) -> str:
        def check() -> str | NotYet:
            for node, seen in sorted(run.recorder.now().items()):
                if seen.reason == reason and h in seen.message:
                    return node
            return NotYet({n: s.reason for n, s in run.recorder.now().items()})

        found: str = until(check, f"a node {reason}", timeout=120)
        return found

    policy = {**ROLLOUT, "waves": [50, 100], "maxUnavailable": 1, "pauseSeconds": 20}
    good, bad_config = {"plugins": {"scan_interval": 0.5}}, {"plugins": {"scan_interval": 0.77}}
    with fleet_run(agents, workdir, bad=[agents - 1, agents - 2], controllers=0) as run:
        g = config_hash_of(good)
        put_config(run.srv, good, policy)
        snap("no controller", [node_in("WaitingForRolloutController", g)])
        run.controllers.append(Controller(run.srv, "ctl-0", run.fleet.base).start())
        on_trial = node_in("OnTrial", g)
        snap("canary on trial", [on_trial, node_in("WaitingForWave", g)])
        until(
            lambda: ((s := run.recorder.status()) and s.rollout.wave_complete_at) or NotYet(s),
            "the canary through",
            timeout=120,
        )
        snap("canary through, pausing between waves", [on_trial])
        patch_rollout(run.srv, paused=True)
        run.wait_phase(g, {"Paused"}, 60)
        snap("paused", [node_in("RolloutPaused", g)])
        patch_rollout(run.srv, paused=False)
        run.wait_phase(g, {"Complete"}, 600)
        snap("complete", [on_trial])
        b = config_hash_of(bad_config)
        put_config(run.srv, bad_config, {**policy, "pauseSeconds": 0, "canary": {"count": 0}})
        run.wait_phase(b, {"Halted"}, 600)
        snap("halted", [node_in("RolledBack", b), node_in("RolloutHalted", b)])
        patch_rollout(run.srv, abort=True)
        run.wait_phase(b, {"Aborted"}, 120)
        snap("aborted", [node_in("RolloutAborted", b)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.load.rollout", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--agents", type=int, default=100)
    p.add_argument("--batch", type=int, default=10, help="agents started at once")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for the rollout")
    p.add_argument(
        "--max-unavailable",
        default=ROLLOUT["maxUnavailable"],
        type=lambda v: v if v.endswith("%") else int(v),
        help="spec.rollout.maxUnavailable: a count or N%% (default: %(default)s)",
    )
    p.add_argument("--json", metavar="FILE", help="write the figures here too")
    p.add_argument(
        "--transcript",
        metavar="FILE",
        help="instead: walk a rollout through every phase and write what an operator sees",
    )
    args = p.parse_args(argv)
    if args.transcript:
        with tempfile.TemporaryDirectory(prefix="na-rollout-") as tmp:
            transcript(args.agents, pathlib.Path(tmp), pathlib.Path(args.transcript))
        return 0
    with tempfile.TemporaryDirectory(prefix="na-rollout-") as tmp:
        t = time.monotonic()
        with fleet_run(args.agents, pathlib.Path(tmp), batch=args.batch) as run:
            started = time.monotonic() - t
            policy = {**ROLLOUT, "maxUnavailable": args.max_unavailable}
            good = {"plugins": {"scan_interval": 0.5}}
            fig = rollout_figures(run, good, args.timeout, policy)
            fig["fleet_start_s"] = round(started, 1)
    for key, value in fig.items():
        print(f"{key:>20}: {value}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
