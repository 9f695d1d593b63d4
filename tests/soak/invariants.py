"""The soak's invariants, checked between events, and the model of what the soak did that they
are checked against.

Two kinds: *always* (checked on every pass: no crash, a quiet pool complete, an invalid config
never active, no good config rolled back, RSS and open files within their bound) and *converges*
(after each event, within `SETTLE_BOUND` from the agent's readiness or the event, whichever is
later: the agent ready and synced, every running plugin's devices published and no slice of a
plugin stopped past its grace, the foreign pool untouched, the Node condition equal to what the
agent runs, the config the soak assigned in force). Writes per minute are checked per minute of
the run. Every violation names the step, the event and the seed (docs/testing/soak.md).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.soak.crash_agent import CRASH_EXIT
from tests.soak.world import (
    MANAGED_BY,
    NODES,
    REPORT_PREFIX,
    SLICE_MAX,
    ApiDown,
    Plugin,
    World,
)

# The bounds (docs/testing/soak.md explains each).
# Seconds for the world to converge once an event is done (the apiserver serving again after
# its restart; an agent READY after its own): a watch waits up to 30 s for a restarted apiserver
# (issue 29 item 15's spread reconnects), then relists, then the agent acts on what it read.
SETTLE_BOUND = 60.0
DISCONNECT_GRACE = 2.0  # resources.disconnect_grace in world.SETTINGS
STARTUP_GRACE = 3.0  # resources.startup_grace in world.SETTINGS
REPORTER_GRACE = 2.0  # reporter.grace in world.SETTINGS
TRIAL_DURATION = 20.0  # dynconfig.trial_duration in world.SETTINGS
RETRY_MAX = 60.0  # seconds between two tries of a failed dynconfig write, at most
REPORTER_CHECKPOINT = "reporter_manager_checkpoint"  # the reporter store's checkpoint name
DYNCONFIG_CHECKPOINT = "dynconfig_state"  # the dynconfig state's checkpoint name
CRASHLOOP_RESTARTS = 3  # dynconfig.crashloop_restarts (default)
RSS_GROWTH = 64 * 2**20  # bytes above an agent's baseline, sustained over five samples
FD_GROWTH = 32  # open files above an agent's baseline, sustained over five samples
BASELINE_AFTER = 20.0  # seconds after READY before an agent's baseline sample
WRITES_BASE = 20  # writes per minute with no event
WRITES_PER_EVENT = 6  # writes per minute each event of the minute (or the one before) may add
CRASH_INVARIANT = "a bad config is rolled back within its bound, named on the Node condition"
SLOW_INVARIANT = (
    "a slow-to-fail config is rolled back at run time, its reason named, the last-known-good run"
)
LOCAL_SCAN = 0.2  # plugins.scan_interval of the local config (world.SETTINGS)
FOREIGN = "soak-foreign"

T = TypeVar("T")


@dataclass
class Model:
    """What the soak did, the expectation the invariants compare against."""

    target: str | None = None  # "good", "invalid" or "crash": the NodeAgentConfig for node-a
    marker: float = LOCAL_SCAN  # its plugins.scan_interval (good and invalid ranges disjoint)
    invalid_markers: set[float] = field(default_factory=set)
    # The good config assigned last, and the ones the agent may still be running on trial:
    # those a kill can catch during their trial. A config just assigned may not be applied
    # yet, an invalid one is refused and leaves the trial running, and one assigned while the
    # state cannot be written is deferred (`TrialDeferred`) and leaves the running config's
    # trial going (seed 7 step 444: the soak blamed neither). A config seen on trial stays a
    # candidate until the agent shows another trial or none (Active, Local).
    last_good: float | None = None
    on_trial: set[float] = field(default_factory=set)
    hashes: dict[str, float] = field(default_factory=dict)  # config hash -> its marker

    def trial_candidates(self) -> set[float]:
        return {m for m in (self.last_good, *self.on_trial) if m is not None}

    def saw_trial(self, dyn: dict[str, Any]) -> None:
        """Follows what may be on trial from the agent's /v1/config `dynamic` part."""
        trial = dyn.get("trial") or {}
        marker = self.hashes.get(trial.get("hash") or "")
        if trial:
            # A trial starts only once it is recorded, and a recorded trial ends the one
            # before it.
            self.on_trial = {marker} if marker is not None else set()
        elif dyn.get("reason") in ("Active", "Local"):
            self.on_trial = set()

    # Good configs the soak put at risk of a (legitimate) rollback: node-a SIGKILLed while it
    # was assigned (a crash during its trial), or stopped cleanly CRASHLOOP_RESTARTS times.
    at_risk: set[float] = field(default_factory=set)
    clean_stops: Counter[float] = field(default_factory=Counter)
    rolled_back: set[float] = field(default_factory=set)
    foreign_rv: str | None = None  # the foreign slice's resourceVersion while it exists
    # Crash-inducing configs (tests/soak/crash_agent.py): marker -> config hash, and how often
    # each made the agent exit (once: it dies during its trial and is rolled back at the start
    # after; a second exit means the agent ran a config it had rolled back). Counted per
    # assignment: markers repeat every 500 steps, and a new generation may be tried once more.
    crash_hashes: dict[float, str] = field(default_factory=dict)
    crash_exits: Counter[float] = field(default_factory=Counter)
    # Slow-to-fail configs (healthy until a pool changes, then its change held back past the
    # bound): marker -> config hash, and the last-known-good the agent named during its trial
    # (a hash, or "local"), the config it must run once it has rolled the slow one back.
    slow_hashes: dict[float, str] = field(default_factory=dict)
    slow_lkg: dict[float, str] = field(default_factory=dict)
    # node-a's state directory: the error its writes fail with now (None: writable), and
    # whether its reporter store has tried a write since (a reporter's new value, in this agent
    # process); after it is writable again, whether it has written since (the failed write's
    # problem is cleared by the next write).
    state_fault: str | None = None
    write_tried: bool = False
    # A good config may have been assigned while the state could not be written: its trial
    # cannot be recorded, so it is not applied (`TrialDeferred`) until a write succeeds (retried,
    # the wait doubling to RETRY_MAX); cleared once node-a converged on a writable state.
    deferred: bool = False
    # The state was unwritable since node-a last converged on a writable one: a dynconfig
    # state write may have failed, to be retried (RETRY_MAX) once writable.
    unsaved: bool = False

    def crash_assigned(self, marker: float, digest: str) -> None:
        """A crash-inducing config assigned. The same marker drawn again later (seed 7 step
        1326, the 2-hour run: 0.9652 at steps 326 and 1326) is a new generation of the object,
        which the agent may try once more (a bad config is not retried until the object's uid or
        generation changes), so its exits count from 0 again."""
        self.crash_hashes[marker] = digest
        self.crash_exits[marker] = 0


@dataclass
class Sample:
    at: float
    rss: int
    fds: int


@dataclass
class AgentRecord:
    """Per agent process: its resource samples and the last write counter seen."""

    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None
    writes: float = 0.0
    # The rollbacks judged in this process (the config's hash, else the agent's words): each
    # once, however many passes see it.
    rollbacks_seen: set[str] = field(default_factory=set)


def crash_difference(
    marker: float,
    hash_: str,
    scan: float,
    cond: dict[str, Any] | None,
    what: str = "crash-inducing",
) -> list[str]:
    """Why a bad config (`what`: crash-inducing, slow-to-fail) is not yet rolled back and
    named on the Node condition (empty: it is): the agent must not run it, and the condition
    must be `RolledBack` naming its hash."""
    out = []
    if scan == marker:
        out.append(f"node-a: runs the {what} config {marker}")
    reason, message = (cond or {}).get("reason"), str((cond or {}).get("message"))
    if reason != "RolledBack" or f"hash {hash_}" not in message:
        out.append(
            f"node-a: the Node condition says {reason}: {message}, want RolledBack naming the "
            f"{what} config {marker} (hash {hash_})"
        )
    return out


def slow_difference(
    model: Model, marker: float, active_hash: str, scan: float, cond: dict[str, Any] | None
) -> list[str]:
    """Why a slow-to-fail config is not rolled back as it must be (empty: it is): the agent
    does not run it, the Node condition is `RolledBack` naming its hash and the health signal
    (resources not ready: a pool not published), and the agent runs the last-known-good it named
    during the trial, a good config or the local one."""
    out = crash_difference(marker, model.slow_hashes[marker], scan, cond, "slow-to-fail")
    message = str((cond or {}).get("message"))
    says_why = "component resources not ready" in message and "not published" in message
    if not out and not says_why:
        out.append(
            f"node-a: the Node condition names the slow-to-fail config {marker} but not its "
            f"reason (component resources not ready: a pool not published): {message}"
        )
    lkg = model.slow_lkg.get(marker)
    if lkg is None:
        return out  # never seen on trial: the condition above says what the agent did
    want = LOCAL_SCAN if lkg == "local" else model.hashes.get(lkg)
    bad = {*model.invalid_markers, *model.crash_hashes, *model.slow_hashes}
    if want is None or want in bad:
        out.append(f"node-a: its last-known-good {lkg} is not a good config ({want})")
    elif active_hash != lkg or scan != want:
        out.append(
            f"node-a: runs {active_hash} (scan_interval {scan}), want its last-known-good "
            f"{lkg} ({want})"
        )
    return out


def state_difference(fault: str | None, write_tried: bool, problems: list[str]) -> str | None:
    """Why node-a's checkpoint problems (/v1/status) do not say what its state directory is
    (None: they do): unwritable (`fault`: the error, "Read-only file system" or "No space left
    on device") with a write tried, the reporter checkpoint's write failure reported with that
    error; writable with a write made, no problem of the reporter checkpoint left; writable,
    no problem of the dynconfig state left (its failed write is retried until it succeeds, the
    wait doubling to RETRY_MAX, with no config change needed)."""
    mine = [p for p in problems if REPORTER_CHECKPOINT in p]
    if fault is not None and write_tried and not any(fault in p for p in mine):
        return f"node-a: state unwritable ({fault}) and a write tried, problems reported {problems}"
    if fault is None and write_tried and mine:
        return f"node-a: state writable again and written, problems still reported {mine}"
    dynconfig = [p for p in problems if DYNCONFIG_CHECKPOINT in p]
    if fault is None and dynconfig:
        return f"node-a: state writable again, the dynconfig state not written: {dynconfig}"
    return None


def deferred(model: Model, dyn: dict[str, Any], scan: float) -> bool:
    """node-a holds the config assigned back (`TrialDeferred`, the older one running) because
    it was assigned while the state could not be written: allowed while it cannot."""
    return (
        model.deferred
        and model.state_fault is not None
        and dyn.get("reason") == "TrialDeferred"
        and scan != model.marker
    )


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = {}
        for part in rest.rstrip("}").split(","):
            if "=" in part:
                k, _, v = part.partition("=")
                labels[k] = v.strip('"')
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


def writes_of(metrics_text: str, status: dict[str, Any]) -> float:
    """Every write the agent sent: slices (and their dry runs), CNR writes, Node Events, and
    the NodeAgentConfigOK condition patches (/v1/status)."""
    counted = {
        "nodeagent_resourceslice_writes_total": lambda labels: True,
        "nodeagent_resourceslice_dry_runs_total": lambda labels: True,
        "nodeagent_cnr_writes_total": lambda labels: labels.get("verb") != "none",
        "nodeagent_node_events_total": lambda labels: (
            labels.get("result") in ("created", "updated")
        ),
    }
    total = sum(
        value
        for name, labels, value in parse_metrics(metrics_text)
        if name in counted and counted[name](labels)
    )
    dyn = status.get("dynconfig") or {}
    return total + float(dyn.get("condition_writes") or 0)


def pool_problems(slices: list[dict[str, Any]]) -> list[str]:
    """Pools that are not complete: slices of more than one generation, a count that is not
    resourceSliceCount, a device in two slices."""
    pools: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in slices:
        spec = s["spec"]
        key = (spec.get("nodeName", ""), spec["driver"], spec["pool"]["name"])
        pools.setdefault(key, []).append(spec)
    problems = []
    for (node, driver, pool), specs in sorted(pools.items()):
        gens = sorted({s["pool"]["generation"] for s in specs})
        counts = sorted({s["pool"]["resourceSliceCount"] for s in specs})
        names = [d["name"] for s in specs for d in s.get("devices", [])]
        if len(gens) > 1 or counts != [len(specs)] or len(names) != len(set(names)):
            problems.append(
                f"{node}/{driver}/{pool}: {len(specs)} slices, generations {gens}, "
                f"resourceSliceCount {counts}, {len(names) - len(set(names))} duplicate devices"
            )
    return problems


def published(slices: list[dict[str, Any]], node: str, driver: str) -> list[dict[str, Any]]:
    return [
        s["spec"]
        for s in slices
        if s["spec"].get("nodeName") == node
        and s["spec"]["driver"] == driver
        and s["metadata"].get("name") != FOREIGN
    ]


def owner_difference(node: str, uid: str, slices: list[dict[str, Any]]) -> str | None:
    """The agent's slices of ``node`` owned by another Node than the current one (re-created)."""
    wrong = [
        s["metadata"]["name"]
        for s in slices
        if s["spec"].get("nodeName") == node
        and s["metadata"].get("labels", {}).get(MANAGED_BY) == "nodeagent"
        and [o.get("uid") for o in s["metadata"].get("ownerReferences", [])] != [uid]
    ]
    return f"{node}: slices {wrong[:3]} not owned by the Node's UID {uid}" if wrong else None


def reporter_difference(reporter: Plugin, annotations: dict[str, str], now: float) -> str | None:
    """Why the node's CNR does not hold what a reporter plugin reports (None: it does): a
    running one's fields there with its values, a stopped one's gone."""
    want = {d["name"]: d["value"] for d in reporter.devices}
    got = {k: annotations[k] for k in want if k in annotations}
    if reporter.running and got != want:
        return f"{reporter.node} CNR: reporter {reporter.driver} reports {want}, the CNR has {got}"
    if not reporter.running and got:
        stopped = now - (reporter.stopped_at or now)
        return (
            f"{reporter.node} CNR: reporter {reporter.driver} stopped {stopped:.0f} s ago "
            f"(grace {REPORTER_GRACE:g} s), its fields {got} still in the CNR"
        )
    return None


def plugin_difference(plugin: Plugin, specs: list[dict[str, Any]]) -> str | None:
    """Why the cluster's pool of a running plugin is not its inventory (None: it is)."""
    want = {d["name"]: d["attributes"]["model"] for d in plugin.devices}
    got: dict[str, Any] = {}
    for spec in specs:
        for d in spec.get("devices", []):
            got[d["name"]] = (d.get("attributes") or {}).get("model", {}).get("string")
    n_slices = (len(want) + SLICE_MAX - 1) // SLICE_MAX
    if got != want or len(specs) != n_slices:
        tags = sorted({str(v) for v in got.values()})
        wanted = plugin.devices[0]["attributes"]["model"] if plugin.devices else "-"
        return (
            f"{plugin.node}/{plugin.driver}: {len(got)} devices in {len(specs)} slices "
            f"(models {tags}), want {len(want)} in {n_slices} (model {wanted})"
        )
    return None


class Invariants:
    """Checks the world against the model; prints and keeps every violation."""

    def __init__(self, world: World, model: Model, seed: int, out: Callable[[str], None]) -> None:
        self.world = world
        self.model = model
        self.seed = seed
        self.out = out
        self.step = 0
        self.event = "start"
        self.checks: Counter[str] = Counter()
        self.violations: list[str] = []
        self.records: dict[int, AgentRecord] = {}  # by agent run
        self.write_log: list[tuple[float, float]] = []  # (monotonic, writes since the last)
        self.event_times: list[float] = []
        self.started = time.monotonic()
        self.last_sample = 0.0
        self._reported: set[str] = set()

    # -- reporting ---------------------------------------------------------------------

    def violation(self, invariant: str, detail: str, *, once: str | None = None) -> None:
        if once is not None:
            if once in self._reported:
                return
            self._reported.add(once)
        line = (
            f"VIOLATION step {self.step} ({self.event}), replay with --seed {self.seed}: "
            f"{invariant}: {detail}"
        )
        self.violations.append(line)
        self.out(line)

    def at_event(self, step: int, event: str) -> None:
        self.step, self.event = step, event
        self.event_times.append(time.monotonic())

    # -- always ------------------------------------------------------------------------

    def always(self) -> None:
        """One pass of the invariants that hold at every moment."""
        self.plugins_run()
        for node in NODES:
            agent = self.world.agents[node]
            self.checks["no crash"] += 1
            if not agent.alive() and not agent.expected_exit:
                code = agent.proc.returncode
                if self._induced_crash(node, code):
                    agent.expected_exit = True
                    self.world.start_agent(node)  # as systemd restarts it
                    continue
                self.violation(
                    "no crash",
                    f"agent {node} (run {agent.run}) exited {code} unasked; log tail:\n"
                    f"{agent.log_tail()}",
                )
                agent.expected_exit = True
                try:
                    self.world.start_agent(node)
                except Exception as exc:  # the convergence check reports it not running
                    self.violation("no crash", f"agent {node} did not start again: {exc}")
                continue
            if not agent.alive() or agent.ready_at is None:
                continue
            try:
                self._resources(agent.run, agent.proc.pid, agent.ready_at)
                self._writes(node)
                self._quiet_pools(node)
                if node == "node-a":
                    self._config_a()
            except (ApiDown, OSError, RuntimeError, ValueError, KeyError):
                continue  # the apiserver or the agent restarting: not observable now

    def plugins_run(self) -> None:
        """The soak's own plugin processes run until it stops them: one that exited by itself
        (it could not start) would pass for a stopped plugin and prove nothing."""
        for plugin in [*self.world.plugins, *self.world.reporters]:
            self.checks["the soak's plugins run"] += 1
            if plugin.proc is not None and plugin.proc.poll() is not None:
                self.violation(
                    "the soak's plugins run",
                    f"{plugin.node}/{plugin.driver} exited {plugin.proc.returncode} unasked",
                )
                plugin.proc = None  # reported once; stopped, as far as the checks go

    def _induced_crash(self, node: str, code: int | None) -> bool:
        """The agent exited because the soak assigned it a crash-inducing config (its hook's
        exit status and log line): expected once per such config, reported as a note; a
        second exit on the same config is a violation (a rolled-back config ran again)."""
        if node != "node-a" or code != CRASH_EXIT:
            return False
        found = re.findall(
            r"soak-crash: plugins.scan_interval ([0-9.]+)", self.world.agents[node].log_tail()
        )
        if not found or float(found[-1]) not in self.model.crash_hashes:
            return False
        marker = float(found[-1])
        self.model.crash_exits[marker] += 1
        self.checks["a bad config is not run again"] += 1
        if self.model.crash_exits[marker] > 1:
            self.violation(
                "a bad config is not run again",
                f"agent {node} exited on the crash-inducing config {marker} "
                f"(hash {self.model.crash_hashes[marker]}) {self.model.crash_exits[marker]} times: "
                "it ran the config again after rolling it back",
            )
        else:
            self.out(f"note: step {self.step}: agent {node} crashed on config {marker} (induced)")
        return True

    def _resources(self, run: int, pid: int, ready_at: float) -> None:
        now = time.monotonic()
        rec = self.records.setdefault(run, AgentRecord())
        if rec.samples and now - rec.samples[-1].at < 2.0:
            return
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rec.samples.append(Sample(now, rss, fds))
        if rec.baseline is None:
            if now - ready_at >= BASELINE_AFTER:
                rec.baseline = rec.samples[-1]
            return
        last = rec.samples[-5:]
        self.checks["rss and open files flat"] += 1
        if len(last) == 5 and min(s.rss for s in last) > rec.baseline.rss + RSS_GROWTH:
            self.violation(
                "rss flat",
                f"agent run {run}: RSS {last[-1].rss >> 20} MiB, baseline "
                f"{rec.baseline.rss >> 20} MiB (bound +{RSS_GROWTH >> 20} MiB)",
                once=f"rss-{run}",
            )
        if len(last) == 5 and min(s.fds for s in last) > rec.baseline.fds + FD_GROWTH:
            self.violation(
                "open files flat",
                f"agent run {run}: {last[-1].fds} open files, baseline {rec.baseline.fds} "
                f"(bound +{FD_GROWTH})",
                once=f"fds-{run}",
            )

    def _writes(self, node: str) -> None:
        agent = self.world.agents[node]
        rec = self.records.setdefault(agent.run, AgentRecord())
        status, text = agent.get("/metrics")
        if status != 200:
            return
        total = writes_of(text, agent.doc("/v1/status"))
        if total > rec.writes:
            self.write_log.append((time.monotonic(), total - rec.writes))
            rec.writes = total

    def _quiet_pools(self, node: str) -> None:
        """Outside the agent's own write windows (it says it is synced with nothing pending,
        before and after the read, and its write counter did not move) every pool in the
        cluster is complete."""
        agent = self.world.agents[node]

        def quiet() -> tuple[bool, float]:
            sync = agent.doc("/v1/resourceslices").get("sync") or {}
            status, text = agent.get("/metrics")
            writes = sum(
                v
                for n, _, v in parse_metrics(text)
                if n in ("nodeagent_resourceslice_writes_total",)
            )
            return bool(sync.get("synced")) and not sync.get(
                "pending_pools"
            ) and status == 200, writes

        before, w1 = quiet()
        if not before:
            return
        slices = self.world.slices()
        after, w2 = quiet()
        if not after or w1 != w2:
            return
        self.checks["a quiet pool is complete"] += 1
        mine = [s for s in slices if s["spec"].get("nodeName") == node]
        for problem in pool_problems(mine):
            self.violation("a quiet pool is complete", problem, once=f"pool-{problem}")
        if node == "node-a":
            self._foreign(slices)

    def _foreign(self, slices: list[dict[str, Any]]) -> None:
        self.checks["foreign slice untouched"] += 1
        found = [s for s in slices if s["metadata"]["name"] == FOREIGN]
        rv = found[0]["metadata"]["resourceVersion"] if found else None
        if rv != self.model.foreign_rv:
            self.violation(
                "foreign slice untouched",
                f"{FOREIGN} resourceVersion {rv}, the soak left it at {self.model.foreign_rv}",
                once=f"foreign-{rv}-{self.model.foreign_rv}",
            )

    def _config_a(self) -> None:
        """An invalid config never active; a good config rolled back only when the soak put
        it at risk (SIGKILL while assigned: a crash during its trial; or
        CRASHLOOP_RESTARTS clean stops)."""
        agent = self.world.agents["node-a"]
        doc = agent.doc("/v1/config")
        scan = doc["effective"]["plugins"]["scan_interval"]
        dyn = doc["dynamic"] or {}
        self.checks["an invalid config never active"] += 1
        if scan in self.model.invalid_markers:
            self.violation(
                "an invalid config never active",
                f"effective plugins.scan_interval {scan} is an invalid config's "
                f"({dyn.get('message')})",
                once=f"invalid-{scan}-{agent.run}",
            )
        active_hash = (dyn.get("active") or {}).get("hash")
        if active_hash and active_hash != "local":
            self.model.hashes[active_hash] = scan
        self.model.saw_trial(dyn)
        self.checks["a good config is never rolled back"] += 1
        rec = self.records.setdefault(agent.run, AgentRecord())
        boot = dyn.get("boot") or {}
        said = ""
        if boot.get("source") == "rollback":
            said = str(boot.get("reason"))
        elif dyn.get("reason") == "RolledBack":
            said = str(dyn.get("message"))
        # Which config: the hash the agent names, else the last good one assigned.
        named = re.search(r"hash ([0-9a-f]{16})", said)
        key = named.group(1) if named else said
        if said and key not in rec.rollbacks_seen:
            rec.rollbacks_seen.add(key)
            m = self.model.hashes.get(named.group(1) if named else "", self.model.last_good)
            if m is not None:
                self.model.rolled_back.add(m)
            # A crash-inducing or slow-to-fail config is rolled back by design, as is one the
            # soak killed.
            model = self.model
            allowed = m is not None and (
                m in model.at_risk or m in model.crash_hashes or m in model.slow_hashes
            )
            if allowed:
                why = (
                    "it crashed the agent"
                    if m in model.crash_hashes
                    else "it held a pool's changes back"
                    if m in model.slow_hashes
                    else "the soak killed the agent during its trial"
                )
                self.out(f"note: step {self.step}: config {m} rolled back, {why} (allowed): {said}")
            else:
                self.violation(
                    "a good config is never rolled back",
                    f"agent run {agent.run}: config {m}: {said} (now {dyn.get('reason')}: "
                    f"{dyn.get('message')}); the soak did not kill it during a trial",
                )

    # -- converges ---------------------------------------------------------------------

    def difference(self) -> list[str]:
        """What differs from the converged state now (empty: converged)."""
        world, model = self.world, self.model
        out: list[str] = []
        slices = world.slices()
        now = time.monotonic()
        for node in NODES:
            agent = world.agents[node]
            if not agent.alive() or agent.ready_at is None:
                out.append(f"agent {node} not running")
                continue
            status, body = agent.get("/readyz")
            if status != 200:
                out.append(f"agent {node} not ready: {body.strip()[:300]}")
            sync = agent.doc("/v1/resourceslices").get("sync") or {}
            if not sync.get("synced") or sync.get("pending_pools"):
                out.append(f"agent {node} not synced: {sync}")
            for plugin in world.plugins:
                if plugin.node != node:
                    continue
                specs = published(slices, node, plugin.driver)
                if plugin.running:
                    diff = plugin_difference(plugin, specs)
                    if diff:
                        out.append(diff)
                elif specs:
                    stopped = now - (plugin.stopped_at or now)
                    out.append(
                        f"{node}/{plugin.driver}: stopped {stopped:.0f} s ago "
                        f"(grace {DISCONNECT_GRACE:g} s), {len(specs)} slices still published"
                    )
            reporters = [r for r in world.reporters if r.node == node]
            annotations = world.cnr_annotations(node) if reporters else {}
            for reporter in reporters:
                diff = reporter_difference(reporter, annotations, now)
                if diff:
                    out.append(diff)
            stray = [k for k in annotations if k.startswith(REPORT_PREFIX)]
            known = {d["name"] for r in reporters for d in r.devices}
            if set(stray) - known:
                out.append(f"{node} CNR: fields of no reporter {sorted(set(stray) - known)}")
            doc = agent.doc("/v1/config")
            dyn = doc["dynamic"] or {}
            uid, cond = world.node(node)
            owners = owner_difference(node, uid, slices)
            if owners:
                out.append(owners)
            mine = (dyn.get("reason"), dyn.get("message"))
            theirs = (cond or {}).get("reason"), (cond or {}).get("message")
            if mine != theirs:
                out.append(f"{node}: the Node condition says {theirs}, the agent runs {mine}")
            if node == "node-a":
                problems = agent.doc("/v1/status").get("checkpoint_problems") or []
                state = state_difference(model.state_fault, model.write_tried, problems)
                if state:
                    out.append(state)
            scan = doc["effective"]["plugins"]["scan_interval"]
            if node == "node-b" or model.target is None:
                want = "Local"
                if scan != LOCAL_SCAN or dyn.get("reason") != want:
                    out.append(f"{node}: runs scan_interval {scan} ({mine}), want the local config")
            elif model.target == "invalid":
                if dyn.get("reason") != "ConfigInvalid":
                    out.append(f"{node}: {mine}, want ConfigInvalid")
            elif model.target == "crash" and deferred(model, dyn, scan):
                pass  # its trial cannot be recorded: not applied (nor crashing) until it can
            elif model.target == "crash":
                out += crash_difference(model.marker, model.crash_hashes[model.marker], scan, cond)
            elif model.target == "slow":
                active = (dyn.get("active") or {}).get("hash", "")
                out += slow_difference(model, model.marker, active, scan, cond)
            elif model.marker in model.rolled_back:
                if scan == model.marker:
                    out.append(f"{node}: runs the rolled-back config {scan} ({mine})")
            elif deferred(model, dyn, scan):
                pass  # its trial cannot be recorded: not applied until the state is writable
            elif scan != model.marker or dyn.get("reason") not in ("OnTrial", "Active"):
                out.append(f"{node}: runs scan_interval {scan} ({mine}), want {model.marker}")
        return out

    def settle(self, since: float) -> float | None:
        """Check continuously until converged; a violation if not within SETTLE_BOUND of
        ``since`` (or of an agent's readiness, if later). Returns how long it took."""
        last: list[str] = ["(not looked yet)"]
        while True:
            self.always()
            start = max([since, *(a.ready_at or since for a in self.world.agents.values())])
            try:
                last = self.difference()
            except (ApiDown, OSError, RuntimeError, ValueError, KeyError) as exc:
                last = [f"not observable: {exc}"]
            name = "converges within the bound"
            if self.model.target == "crash":
                # Measured from the assignment, the crash and the restart it causes included.
                name, start = CRASH_INVARIANT, since
            elif self.model.target == "slow":
                name = SLOW_INVARIANT
            bound = SETTLE_BOUND
            if (self.model.deferred or self.model.unsaved) and self.model.state_fault is None:
                # A deferred trial's marker, or the dynconfig state a write failed to save, is
                # written again at the next retry, at most RETRY_MAX after the state became
                # writable.
                bound += RETRY_MAX
            if not last:
                self.checks[name] += 1
                if self.model.state_fault is None:
                    self.model.deferred = self.model.unsaved = False
                return time.monotonic() - since
            if time.monotonic() - start > bound:
                self.checks[name] += 1
                self.violation(
                    name,
                    f"not converged {bound:g} s after the event: " + "; ".join(last),
                )
                return None
            time.sleep(0.5)

    def wait_for(self, check: Callable[[], T | None], bound: float) -> T | None:
        """Check continuously (the *always* invariants too) until ``check`` answers, at most
        ``bound`` seconds: its answer, or None (the convergence check then says what differs).
        For an event that must see the agent do something before it goes on."""
        end = time.monotonic() + bound
        while True:
            try:
                got = check()
            except (ApiDown, OSError, RuntimeError, ValueError, KeyError):
                got = None  # the apiserver or the agent restarting: not observable now
            if got is not None or time.monotonic() > end:
                return got
            self.always()
            time.sleep(0.2)

    def watch(self, seconds: float) -> None:
        """Continuous checks for ``seconds`` (the quiet time between two events)."""
        end = time.monotonic() + seconds
        while True:
            self.always()
            if time.monotonic() >= end:
                return
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))

    # -- at the end --------------------------------------------------------------------

    def writes_per_minute(self) -> list[tuple[int, int, int]]:
        """(minute, writes, events) per whole minute of the run; a violation for a minute
        over WRITES_BASE + WRITES_PER_EVENT x (events of the minute and the one before)."""
        rows = []
        end = time.monotonic()
        minute = 0
        while self.started + 60 * (minute + 1) <= end:
            lo, hi = self.started + 60 * minute, self.started + 60 * (minute + 1)
            writes = int(sum(n for t, n in self.write_log if lo <= t < hi))
            events = sum(1 for t in self.event_times if lo - 60 <= t < hi)
            rows.append((minute, writes, events))
            self.checks["writes per minute"] += 1
            bound = WRITES_BASE + WRITES_PER_EVENT * events
            if writes > bound:
                self.step, self.event = -1, f"minute {minute} of the run"
                self.violation(
                    "writes per minute",
                    f"{writes} writes in minute {minute}, bound {bound} ({events} events)",
                )
            minute += 1
        return rows


def stop_agent(inv: Invariants, node: str, signum: int) -> None:
    """Stop an agent as an event does; a SIGTERM must be a clean stop (exit 0), unless the
    agent exited on a crash-inducing config just before it (seed 7 step 824: the config
    assigned a moment earlier): that is the induced crash, judged as one."""
    agent = inv.world.agents[node]
    code = agent.stop(signum)
    if signum == signal.SIGTERM:
        inv.checks["a SIGTERM is a clean stop"] += 1
        if code != 0 and not inv._induced_crash(node, code):
            inv.violation(
                "a SIGTERM is a clean stop",
                f"agent {node} run {agent.run} exited {code}; log tail:\n{agent.log_tail()}",
            )
