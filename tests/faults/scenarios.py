"""The fault scenarios: each starts a fresh agent and plugin through `FaultEnv`, waits until the
cluster equals the expectation, injects one fault (changing the plugin's inventory while it
lasts, so the agent has something to publish), clears it, and measures.

Per scenario the `Result` says: did the agent survive (still running, ready, the cluster equal
to a fresh computation within the bound), objects lost or duplicated, writes beyond the ones the
change needs (from the apiserver's audit log: every request the agent's identity made), the
time from the fault clearing (or starting, for faults the agent must detect itself) to the
cluster being right, and the LISTs the agent sent.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.env import DRIVER, NODE, FaultEnv, inventory
from tests.support.faultproxy import FaultProxy
from tests.support.wait import until

# How long the cluster may stay wrong after a fault clears, and the writes a scenario may add
# beyond the ones its change needs (retries of writes the fault broke). docs/testing/faults.md
# explains each figure.
DEFAULT_BOUND = 30.0
QUIET = 3.0  # seconds watched after recovery: any write then is a storm
# Writes every agent start makes: the NodeAgentConfigOK condition at boot ("running the local
# config: no checkpoint"), then once the NodeAgentConfigs are read ("no NodeAgentConfig targets
# the node").
START_WRITES = 2


@dataclass
class Result:
    fault: str
    survived: bool
    lost: int
    duplicated: int
    writes: int
    needed: int
    recover_s: float
    lists: int
    note: str = ""
    allowed_extra: int = 0  # the scenario's bound on extra writes

    @property
    def extra_writes(self) -> int:
        return max(0, self.writes - self.needed)


@dataclass
class Ctx:
    """What a scenario's body gets: the environment, the proxy its agent talks through."""

    env: FaultEnv
    proxy: FaultProxy | None
    settings: tuple[str, ...]
    needed: int = 1  # writes the change itself needs (one slice updated)
    extra_bound: int | None = None  # set by a scenario whose bound depends on what it measured
    note: str = ""
    notes: list[str] = field(default_factory=list)

    def change(self, tag: str, n: int = 4) -> None:
        self.env.set_inventory(inventory(n, tag))

    def restart_agent(self, kill: bool = True) -> None:
        assert self.env.agent is not None
        if kill:
            self.env.agent.kill()
        else:
            self.env.agent.stop()
        self.start_agent()

    def start_agent(self) -> None:
        self.env.start_agent(*self.settings)
        self.needed += START_WRITES


Body = Callable[[Ctx], float]  # returns when the fault cleared (time.monotonic())


@dataclass
class Scenario:
    name: str
    body: Body
    fast: bool  # in the CI subset (tests/faults/test_matrix.py)
    proxy: str = "passthrough"  # "passthrough", "terminating" or "direct"
    settings: tuple[str, ...] = ()
    token: bool = False
    bound: float = DEFAULT_BOUND
    extra_bound: int = 3


def run(env: FaultEnv, sc: Scenario) -> Result:
    proxy = {"passthrough": env.passthrough, "terminating": env.terminating, "direct": None}[
        sc.proxy
    ]
    env.begin(inventory(4, "start"), token=sc.token)
    try:
        env.write_kubeconfig(proxy)
        env.start_agent(*sc.settings)
        env.settled()
        ctx = Ctx(env, proxy, sc.settings)
        mark = env.audit_mark()
        cleared = sc.body(ctx)
        try:
            ok_at = env.settled(timeout=sc.bound + 30)
        except AssertionError:
            ok_at = float("nan")
        # Watch the quiet period: the cluster must stay right and the agent must stop writing.
        time.sleep(QUIET)
        diff = env.diff()
        writes = env.slice_writes(mark) + env.other_writes(mark)
        agent = env.agent
        assert agent is not None
        ready = env.ready()
        recover = ok_at - cleared
        extra_bound = sc.extra_bound if ctx.extra_bound is None else ctx.extra_bound
        survived = (
            ready and diff.equal and recover <= sc.bound and writes - ctx.needed <= extra_bound
        )
        note = "; ".join([*ctx.notes, *diff.wrong])
        if not ready:
            note = "; ".join([note, f"agent not ready (alive={agent.alive()})"]).strip("; ")
        return Result(
            sc.name,
            survived,
            diff.lost,
            diff.duplicated,
            writes,
            ctx.needed,
            recover,
            env.lists(mark),
            note,
            extra_bound,
        )
    finally:
        env.end()


# -- network faults through the pass-through proxy ----------------------------------------


def cut_all(ctx: Ctx) -> float:
    """Every open connection closed (FIN), the inventory changed at the same moment."""
    assert ctx.proxy is not None
    ctx.notes.append(f"{ctx.proxy.cut_all()} connections cut")
    ctx.change("cut")
    return time.monotonic()


def reset_all(ctx: Ctx) -> float:
    assert ctx.proxy is not None
    ctx.notes.append(f"{ctx.proxy.reset_all()} connections reset")
    ctx.change("reset")
    return time.monotonic()


def stall(ctx: Ctx) -> float:
    """Open connections go mute (no FIN): the agent must notice by itself. Measured from the
    start of the fault, which never clears for those connections."""
    assert ctx.proxy is not None
    start = time.monotonic()
    ctx.notes.append(f"{ctx.proxy.stall()} connections stalled")
    ctx.change("stall")
    agent = ctx.env.agent
    assert agent is not None
    until(
        lambda: metric(
            agent.get("/metrics")[1],
            'nodeagent_watch_restarts_total{resource="resourceslices",reason="inactivity"}',
        ),
        "the stalled slice watch to be noticed",
        timeout=60,
    )
    return start


def refuse(ctx: Ctx) -> float:
    """A 5 s outage: open connections cut, new ones refused, then the port answers again."""
    assert ctx.proxy is not None
    ctx.proxy.refuse(True)
    ctx.proxy.cut_all()
    ctx.change("refuse")
    time.sleep(5)  # the outage's length, not a synchronisation
    ctx.proxy.refuse(False)
    return time.monotonic()


def latency(ctx: Ctx) -> float:
    """300 ms on every chunk both ways (streams cut so they reopen through it)."""
    assert ctx.proxy is not None
    ctx.proxy.set_latency(0.3)
    ctx.proxy.cut_all()
    ctx.change("latency")
    return time.monotonic()


# -- HTTP faults through the terminating proxy ----------------------------------------------


def too_many_requests(ctx: Ctx) -> float:
    """429 with Retry-After: 1 on the next 6 slice requests (watch, list and writes)."""
    assert ctx.proxy is not None
    ctx.proxy.respond(429, 6, retry_after=1, match="resourceslices")
    ctx.proxy.cut_all()
    ctx.change("429")
    return time.monotonic()


def server_errors(ctx: Ctx) -> float:
    """A burst: the next 10 requests get 503, the 5 after them 500."""
    assert ctx.proxy is not None
    ctx.proxy.respond(503, 10)
    ctx.proxy.respond(500, 5)
    ctx.proxy.cut_all()
    ctx.change("5xx")
    return time.monotonic()


def reset_mid_response(ctx: Ctx) -> float:
    """The next 4 slice responses cut with an RST 150 bytes in (lists, watches, writes)."""
    assert ctx.proxy is not None
    ctx.proxy.reset_mid_response(4, after=150, match="resourceslices")
    ctx.proxy.cut_all()
    ctx.change("rst")
    return time.monotonic()


# -- the apiserver ----------------------------------------------------------------------------


def apiserver_restart(ctx: Ctx) -> float:
    """SIGTERM and start again (etcd kept) while the agent watches; the inventory changes while
    the apiserver is down."""
    ctx.env.apiserver.stop_apiserver()
    ctx.change("restart")
    ctx.env.apiserver.start_apiserver()
    return time.monotonic()


def apiserver_crash_mid_write(ctx: Ctx) -> float:
    """SIGKILL right after an inventory change (the agent's write in flight), then start."""
    ctx.change("crash")
    ctx.env.apiserver.kill_apiserver()
    ctx.env.apiserver.start_apiserver()
    return time.monotonic()


def compaction(ctx: Ctx) -> float:
    """etcd compacted past the agent's resourceVersion and the apiserver restarted (its watch
    cache gone): resuming the watch gets 410 Gone and the agent relists."""
    env = ctx.env
    for _i in range(20):  # move the revision on past the agent's last bookmark
        env.admin(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "k3-"}},
        )
    env.apiserver.stop_apiserver()
    env.apiserver.compact()
    ctx.change("compacted")
    env.apiserver.start_apiserver()
    return time.monotonic()


def node_recreated(ctx: Ctx) -> float:
    """The Node deleted and created again (a new UID): every slice re-owned, once."""
    env = ctx.env
    status, body = env.admin("DELETE", f"/api/v1/nodes/{NODE}")
    assert status == 200, body
    until(lambda: env.node_uid() is None, "the Node to be gone", timeout=60)
    env.ensure_node()
    ctx.needed = 2  # the slice re-owned, the condition written on the new Node
    return time.monotonic()


# -- credentials ---------------------------------------------------------------------------


def cert_rotation(ctx: Ctx) -> float:
    """The client certificate files rewritten with a new key and certificate (what the
    kubelet's rotation does): new connections must present the new identity."""
    env, proxy = ctx.env, ctx.proxy
    assert proxy is not None
    crt, key = env.apiserver.issue_client_cert(NODE, env.creds / "rotated")
    proxy.add_identity("node-a-rotated", crt, key)
    # The key first: a reader between the two writes sees a mismatched pair and keeps the old.
    (env.creds / "client.key").write_bytes(key.read_bytes())
    (env.creds / "client.crt").write_bytes(crt.read_bytes())
    rotated_at = time.monotonic()
    ctx.change("rotated")
    until(
        lambda: any(r.identity == "node-a-rotated" for r in proxy.requests if r.at > rotated_at),
        "a request with the rotated certificate",
        timeout=60,
    )
    return rotated_at


def token_rotation(ctx: Ctx) -> float:
    """The token file rewritten and the old token revoked (401): the agent re-reads the file."""
    env, proxy = ctx.env, ctx.proxy
    assert proxy is not None
    old = env.apiserver.token("token-a")
    (env.creds / "token").write_text(env.apiserver.token("token-b") + "\n")
    proxy.reject_token(old)
    ctx.change("token")
    return time.monotonic()


# -- plugins ----------------------------------------------------------------------------------


def plugin_crash(ctx: Ctx) -> float:
    """SIGKILL of the plugin (its socket left behind), a new inventory, the plugin restarted
    within resources.disconnect_grace: slices kept meanwhile, then updated once."""
    ctx.env.kill_plugin()
    ctx.change("crashed")
    ctx.env.start_plugin()
    return time.monotonic()


def plugin_hang(ctx: Ctx) -> float:
    """SIGSTOP of the plugin for 5 s (its sockets accept, nothing answers; the agent's probe and
    stream see silence), the inventory changed meanwhile, then SIGCONT."""
    plugin = ctx.env.plugin
    assert plugin is not None
    plugin.send_signal(signal.SIGSTOP)
    ctx.change("hung")
    time.sleep(5)  # the hang's length, not a synchronisation
    plugin.send_signal(signal.SIGCONT)
    return time.monotonic()


def plugin_flood(ctx: Ctx) -> float:
    """2,000 distinct inventories back to back, then the final one: written at most once per
    resources.min_sync_interval (0.1 s) while the flood lasts, the last one wins."""
    env = ctx.env
    start = time.monotonic()
    env.set_inventory(inventory(4, "flooded"), flood=2000)
    flood = env.inventory_file.with_suffix(".json.flood")
    until(lambda: not flood.exists(), "the plugin to send its flood", timeout=60)
    lasted = time.monotonic() - start
    ctx.extra_bound = math.ceil(lasted / 0.1) + 1
    ctx.notes.append(f"the flood lasted {lasted:.1f} s")
    return time.monotonic()


def plugin_invalid(ctx: Ctx) -> float:
    """An invalid inventory (a device name that is not a DNS label): rejected as a whole, the
    last valid one stays published; then a valid change is published."""
    env = ctx.env
    bad = inventory(4, "bad")
    bad[1]["name"] = "Not_A_Label"
    env.set_inventory(bad, valid=False)
    until(
        lambda: "Not_A_Label" in json.dumps(env.admin("GET", "/api/v1/namespaces/default/events")),
        "the rejection Event",
        timeout=60,
    )
    if not env.diff().equal:
        ctx.notes.append("the last valid inventory was not kept")
    ctx.change("valid-again")
    return time.monotonic()


def plugin_socket_deleted(ctx: Ctx) -> float:
    """The plugin's socket file deleted under its open stream (the plugin is gone as far as the
    registry says): the slices stay for the disconnect grace; the plugin restarted with a new
    inventory takes over."""
    env = ctx.env
    for sock in Path(env.registry).glob("*.sock"):
        sock.unlink()
    until(lambda: not env.plugin_registered(), "the agent to see the plugin gone", timeout=60)
    if not env.diff().equal:
        ctx.notes.append("slices changed within the disconnect grace")
    env.kill_plugin()
    ctx.change("new-socket")
    env.start_plugin()
    return time.monotonic()


def two_plugins_one_name(ctx: Ctx) -> float:
    """A second live instance of the driver registers (a rolling update): the newest
    registration serves, so its inventory is published; when it stops, the first one's is
    published again."""
    env = ctx.env
    first = env.devices
    second = env.start_second_plugin(inventory(6, "second"))
    env.devices = inventory(6, "second")
    env.settled()
    second.kill()
    second.wait(30)
    Path(env.registry, f"{DRIVER}-second-reg.sock").unlink(missing_ok=True)
    env.devices = first
    ctx.needed = 2  # the second instance's inventory, then the first's again
    return time.monotonic()


# -- the agent itself ---------------------------------------------------------------------


def kill9_loop(ctx: Ctx) -> float:
    """Five times: a new inventory, then `kill -9` of the agent 0-0.5 s later (during its
    writes and its checkpoint writes), then a new agent on the same state dir."""
    rng = random.Random(13)
    for i in range(5):
        ctx.change(f"kill{i}")
        time.sleep(rng.uniform(0, 0.5))  # where the kill lands: the fault, not a sync
        ctx.restart_agent(kill=True)
    ctx.needed += 4  # each inventory may be written once before the next kill
    return time.monotonic()


def corrupt_checkpoint(ctx: Ctx) -> float:
    """The agent stopped, every checkpoint file overwritten with garbage, the inventory changed,
    the agent started again: corrupt files moved aside, publishing unaffected."""
    env = ctx.env
    assert env.agent is not None
    env.agent.stop()
    files = [p for p in (env.state_dir / "checkpoints").glob("*") if ".corrupt-" not in p.name]
    for p in files:
        p.write_bytes(b"\x00garbage" * 10)
    ctx.notes.append(f"{len(files)} checkpoint files corrupted")
    ctx.change("corrupt")
    ctx.start_agent()
    until(
        lambda: len(list((env.state_dir / "checkpoints").glob("*.corrupt-*"))) >= len(files),
        "the corrupt checkpoints to be moved aside",
        timeout=60,
    )
    return time.monotonic()


def full_disk(ctx: Ctx) -> float:
    """The state dir on a 1 MiB tmpfs (mounted for real), filled to the last byte, then the
    agent restarted on it (its start-up checkpoint writes fail) and the inventory changed;
    then the space freed."""
    env = ctx.env
    assert env.agent is not None
    env.agent.stop()
    mnt = env.state_dir
    saved = Path(str(mnt) + ".saved")
    mnt.rename(saved)
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    # Unmounted at the end of the case, once the agent is gone.
    env.cleanups.append(lambda: subprocess.run(["umount", "-l", str(mnt)], check=False))
    subprocess.run(["cp", "-a", f"{saved}/.", str(mnt)], check=True)
    filler = mnt / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    ctx.start_agent()
    agent = env.agent
    assert agent is not None
    ctx.change("full")
    env.settled()
    failures = until(
        lambda: metric(agent.get("/metrics")[1], "nodeagent_checkpoint_write_failures_total"),
        "a failed checkpoint write",
        timeout=60,
    )
    ctx.notes.append(f"disk full: {failures:.0f} checkpoint writes failed, slices and CNR right")
    filler.unlink()
    return time.monotonic()


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in a /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


SCENARIOS: list[Scenario] = [
    Scenario("streams cut (FIN)", cut_all, fast=True),
    Scenario("streams reset (RST)", reset_all, fast=False),
    Scenario(
        "streams stalled (no FIN)",
        stall,
        fast=True,
        settings=("kube.watch_inactivity_timeout=5", "kube.request_timeout=5"),
    ),
    Scenario("connections refused 5 s", refuse, fast=False),
    Scenario("latency 300 ms per chunk", latency, fast=False),
    Scenario("429 + Retry-After", too_many_requests, fast=True, proxy="terminating"),
    Scenario("burst of 503 then 500", server_errors, fast=False, proxy="terminating"),
    # Each cut answer may cost one retry of the write it belonged to.
    Scenario(
        "reset mid-response", reset_mid_response, fast=True, proxy="terminating", extra_bound=4
    ),
    # A restarted apiserver's Node authorizer answers 403 until its graph is synced; the pool
    # retries on its 5 ms doubling backoff: at most ~10 tries in the first 5 s.
    Scenario("apiserver restart mid-watch", apiserver_restart, fast=True, extra_bound=10),
    Scenario("apiserver kill -9 mid-write", apiserver_crash_mid_write, fast=False, extra_bound=10),
    Scenario("etcd compaction (410)", compaction, fast=False, extra_bound=10),
    Scenario("Node deleted and re-created", node_recreated, fast=True),
    Scenario("client cert rotated", cert_rotation, fast=False, proxy="terminating"),
    Scenario(
        "token rotated + old revoked", token_rotation, fast=False, proxy="terminating", token=True
    ),
    Scenario("plugin kill -9 + restart", plugin_crash, fast=True),
    Scenario("plugin hung 5 s (SIGSTOP)", plugin_hang, fast=False),
    Scenario("plugin flood (2,000 messages)", plugin_flood, fast=True),
    Scenario("plugin sends an invalid inventory", plugin_invalid, fast=False),
    Scenario("plugin socket deleted mid-stream", plugin_socket_deleted, fast=False),
    Scenario("two live plugins with one name", two_plugins_one_name, fast=False),
    Scenario("agent kill -9 x5 during writes", kill9_loop, fast=False, proxy="direct"),
    Scenario("corrupt checkpoints", corrupt_checkpoint, fast=True, proxy="direct"),
    Scenario("state dir disk full", full_disk, fast=False, proxy="direct"),
]
