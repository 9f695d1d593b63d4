"""The soak's events: a weighted table of what a week on a node does, each event a function that
does it to the world and updates the model (what the invariants expect).

An event applies only when its precondition holds (a stopped plugin cannot be killed); the draw
is repeated until one applies. Preconditions depend only on the soak's own earlier events, so a
seed replays the same schedule.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from nodeagent.dynconfig.overlay import config_hash
from tests.soak.crash_agent import CRASH_RANGE
from tests.soak.invariants import (
    CRASHLOOP_RESTARTS,
    FOREIGN,
    SETTLE_BOUND,
    TRIAL_DURATION,
    Invariants,
    plugin_difference,
    published,
    stop_agent,
)
from tests.soak.world import NAC_PATH, SLICES_PATH, ApiDown, Plugin, inventory, report

NAC_NAME = "soak"
# plugins.scan_interval of the slow-to-fail configs: disjoint from the good [0.3, 0.5), invalid
# [0.6, 0.8), crash-inducing [0.9, 1.0) and local (0.2) values.
SLOW_RANGE = (0.8, 0.9)
# Pool sizes: across the 128-device slice boundary both ways (a pool growing to two slices and
# shrinking back to one, issue 29 item 11).
SIZES = (3, 40, 127, 129, 200)


@dataclass(frozen=True)
class Event:
    name: str
    weight: int
    applies: Callable[[Invariants], bool]
    run: Callable[[Invariants, random.Random], str]


def _running(inv: Invariants) -> list[Plugin]:
    return [p for p in inv.world.plugins if p.running]


def _stopped(inv: Invariants) -> list[Plugin]:
    return [p for p in inv.world.plugins if not p.running]


def _new_inventory(rng: random.Random, step: int) -> list[dict[str, object]]:
    return list(inventory(rng.choice(SIZES), f"s{step}"))


def plugin_kill(inv: Invariants, rng: random.Random) -> str:
    """SIGKILL (an OOM kill): the registration socket stays behind."""
    p = rng.choice(_running(inv))
    p.stop(signal.SIGKILL)
    return f"SIGKILL plugin {p.node}/{p.driver} (socket left)"


def plugin_start(inv: Invariants, rng: random.Random) -> str:
    p = rng.choice(_stopped(inv))
    if rng.random() < 0.5:
        p.set_inventory(_new_inventory(rng, inv.step))
    p.start()
    return f"start plugin {p.node}/{p.driver} ({len(p.devices)} devices)"


def plugin_upgrade(inv: Invariants, rng: random.Random) -> str:
    """An upgrade in place: the old process killed, the new one started at once with another
    inventory."""
    p = rng.choice(_running(inv))
    p.stop(rng.choice((signal.SIGKILL, signal.SIGTERM)))
    p.set_inventory(_new_inventory(rng, inv.step))
    p.start()
    return f"upgrade plugin {p.node}/{p.driver} ({len(p.devices)} devices)"


def plugin_inventory(inv: Invariants, rng: random.Random) -> str:
    p = rng.choice(_running(inv))
    p.set_inventory(_new_inventory(rng, inv.step))
    return f"inventory of {p.node}/{p.driver} -> {len(p.devices)} devices"


def reporter_kill(inv: Invariants, rng: random.Random) -> str:
    """A reporter plugin killed (SIGKILL leaves its socket): its fields leave the CNR once its
    grace is over."""
    r = rng.choice([r for r in inv.world.reporters if r.running])
    signum = rng.choice((signal.SIGKILL, signal.SIGTERM))
    r.stop(signum)
    return f"{signal.Signals(signum).name} reporter {r.node}/{r.driver}"


def reporter_start(inv: Invariants, rng: random.Random) -> str:
    r = rng.choice([r for r in inv.world.reporters if not r.running])
    if rng.random() < 0.5:
        r.set_inventory(report(r.driver, f"s{inv.step}"))
    r.start()
    return f"start reporter {r.node}/{r.driver} ({r.devices[0]['value']})"


def reporter_report(inv: Invariants, rng: random.Random) -> str:
    r = rng.choice([r for r in inv.world.reporters if r.running])
    r.set_inventory(report(r.driver, f"s{inv.step}"))
    if r.node == "node-a":
        inv.model.write_tried = True  # the reporter store writes its checkpoint
    return f"reporter {r.node}/{r.driver} reports {r.devices[0]['value']}"


RESUME_INVARIANT = "a trial stopped cleanly while the state is unwritable is resumed"


def _trial_left(inv: Invariants) -> dict[str, object] | None:
    """node-a's trial now, if it has seconds enough left to outlive a restart (None: none)."""
    try:
        trial = inv.world.agents["node-a"].doc("/v1/config")["dynamic"]["trial"]
    except (ApiDown, OSError, RuntimeError, ValueError, KeyError, TypeError):
        return None  # the agent restarting: not observable now
    if not isinstance(trial, dict) or float(trial.get("remaining") or 0) < 5:
        return None
    return trial


def check_resumed(inv: Invariants, trial: dict[str, object]) -> None:
    """After a SIGTERM during a trial while the state could not be written, the new agent
    resumed it from the runtime directory's copy (607b45e): not rolled back."""
    boot = inv.world.agents["node-a"].doc("/v1/config")["dynamic"].get("boot") or {}
    inv.checks[RESUME_INVARIANT] += 1
    reason = str(boot.get("reason"))
    if boot.get("source") != "resumed" or "runtime directory" not in reason:
        inv.violation(
            RESUME_INVARIANT,
            f"trial of {trial.get('hash')} ({trial.get('remaining')} s left): the next start "
            f"says {boot.get('source')}: {reason}",
        )


def _restart_agent(inv: Invariants, signum: int) -> None:
    model = inv.model
    # A clean stop during a trial while the state cannot be written: the trial goes on at the
    # next start, read from the runtime directory (its restarts below the crash-loop limit).
    trial = _trial_left(inv) if signum == signal.SIGTERM and inv.world.faulty() else None
    if trial is not None and int(str(trial.get("restarts") or 0)) + 1 >= CRASHLOOP_RESTARTS:
        trial = None
    for good in model.trial_candidates():
        # A config that may be on trial when the agent dies: a SIGKILL is a crash during its
        # trial, the CRASHLOOP_RESTARTS-th clean stop counts as crash-looping (both documented).
        if signum == signal.SIGKILL:
            model.at_risk.add(good)
        else:
            model.clean_stops[good] += 1
            if model.clean_stops[good] >= CRASHLOOP_RESTARTS:
                model.at_risk.add(good)
    stop_agent(inv, "node-a", signum)
    inv.model.write_tried = False  # a new process: no write tried yet, no problem to report
    inv.world.start_agent("node-a")
    if trial is not None:
        check_resumed(inv, trial)


def agent_sigterm(inv: Invariants, rng: random.Random) -> str:
    _restart_agent(inv, signal.SIGTERM)
    return "SIGTERM node-a's agent, restart"


def agent_sigkill(inv: Invariants, rng: random.Random) -> str:
    _restart_agent(inv, signal.SIGKILL)
    return "SIGKILL node-a's agent, restart"


def agent_kill_during_write(inv: Invariants, rng: random.Random) -> str:
    """A new inventory, then the agent killed while it is writing it (or just before)."""
    p = rng.choice([p for p in _running(inv) if p.node == "node-a"])
    p.set_inventory(_new_inventory(rng, inv.step))
    delay = rng.uniform(0.0, 0.6)
    time.sleep(delay)  # the moment of the kill, drawn: not a synchronisation
    signum = rng.choice((signal.SIGKILL, signal.SIGTERM))
    _restart_agent(inv, signum)
    return (
        f"inventory of {p.driver} -> {len(p.devices)} devices, then "
        f"{signal.Signals(signum).name} node-a's agent after {delay:.2f} s, restart"
    )


def watch_cut(inv: Invariants, rng: random.Random) -> str:
    n = inv.world.proxy.cut_all()
    return f"every connection through the proxy cut ({n})"


def apiserver_restart(inv: Invariants, rng: random.Random) -> str:
    inv.world.apiserver.restart()
    return "kube-apiserver restarted (same etcd)"


def _put_config(inv: Invariants, config: dict[str, object]) -> None:
    body = {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeAgentConfig",
        "metadata": {"name": NAC_NAME},
        "spec": {"nodeNames": ["node-a"], "config": config},
    }
    status, got = inv.world.admin("GET", f"{NAC_PATH}/{NAC_NAME}")
    if status == 404:
        status, got = inv.world.admin("POST", NAC_PATH, body)
    elif status == 200:
        body["metadata"] = got["metadata"]
        status, got = inv.world.admin("PUT", f"{NAC_PATH}/{NAC_NAME}", body)
    if status not in (200, 201):
        raise ApiDown(f"NodeAgentConfig write: {status} {got}")


def config_good(inv: Invariants, rng: random.Random) -> str:
    # plugins.scan_interval marks the config: good ones in [0.3, 0.5), invalid in [0.6, 0.8),
    # unique for 1000 steps.
    marker = round(0.3 + 0.0002 * (inv.step % 1000), 4)
    config: dict[str, object] = {"plugins": {"scan_interval": marker}}
    if rng.random() < 0.5:
        config["agent"] = {"log_level": rng.choice(("info", "warning"))}
    _put_config(inv, config)
    inv.model.target, inv.model.marker, inv.model.last_good = "good", marker, marker
    if inv.world.faulty():
        inv.model.deferred = True  # its trial cannot be recorded yet
    inv.model.hashes[config_hash(config)] = marker  # known as a last-known-good by its hash
    # A new generation of the object: a config rolled back before is tried again.
    inv.model.rolled_back.discard(marker)
    inv.model.at_risk.discard(marker)
    inv.model.clean_stops.pop(marker, None)
    return f"NodeAgentConfig {NAC_NAME} good: {config}"


def config_invalid(inv: Invariants, rng: random.Random) -> str:
    marker = round(0.6 + 0.0002 * (inv.step % 1000), 4)
    kind = rng.choice(("static", "typo", "negative"))
    plugins: dict[str, object] = {"scan_interval": marker}
    config: dict[str, object] = {"plugins": plugins}
    if kind == "static":
        config["kube"] = {"kubeconfig": "/etc/other"}
    elif kind == "typo":
        plugins["probe_intervall"] = 1
    else:
        plugins["probe_interval"] = -1
    _put_config(inv, config)
    inv.model.target, inv.model.marker = "invalid", marker
    inv.model.invalid_markers.add(marker)
    return f"NodeAgentConfig {NAC_NAME} invalid ({kind}): {config}"


def config_crash(inv: Invariants, rng: random.Random) -> str:
    """A config that makes the agent exit during its trial (tests/soak/crash_agent.py: a
    plugins.scan_interval in CRASH_RANGE): the soak restarts the agent, as systemd would, and
    the agent must roll the config back at that start and name it on the Node condition."""
    marker = round(CRASH_RANGE[0] + 0.0002 * (inv.step % 500), 4)
    config: dict[str, object] = {"plugins": {"scan_interval": marker}}
    _put_config(inv, config)
    digest = config_hash(config)
    inv.model.target, inv.model.marker = "crash", marker
    if inv.world.faulty():
        # Its trial cannot be recorded: deferred (the older config running) until the state
        # can be written, then applied, the crash and its rollback.
        inv.model.deferred = True
    inv.model.crash_assigned(marker, digest)
    inv.model.hashes[digest] = marker
    return f"NodeAgentConfig {NAC_NAME} crash-inducing (hash {digest}): {config}"


def config_slow(inv: Invariants, rng: random.Random) -> str:
    """A slow-to-fail config: healthy when applied, it holds every pool change after the first
    back for an hour (`resources.min_sync_interval` 3600, a real setting), so once a node-a
    plugin's inventory changes during its trial the pool stays unpublished past
    `resources.publish_failure_bound`, `resources` turns not ready, and past
    `dynconfig.unready_bound` the trial rolls the config back at run time (no restart), to the
    last-known-good. The event waits for the trial, changes the inventory, and waits for the
    rollback (the next event after it): a restart before it would begin the pool afresh, with
    nothing held back (docs/testing/soak.md)."""
    marker = round(SLOW_RANGE[0] + 0.0002 * (inv.step % 500), 4)
    config: dict[str, object] = {
        "plugins": {"scan_interval": marker},
        "resources": {"min_sync_interval": 3600},
    }
    p = rng.choice([p for p in _running(inv) if p.node == "node-a"])
    devices = _new_inventory(rng, inv.step)
    model, agent = inv.model, inv.world.agents["node-a"]
    # The pool synced in this agent process (its inventory published): its next change waits
    # for min_sync_interval from that sync, not written at once as a pool's first sync is.
    inv.wait_for(
        lambda: (
            plugin_difference(p, published(inv.world.slices(), p.node, p.driver)) is None or None
        ),
        SETTLE_BOUND,
    )
    _put_config(inv, config)
    digest = config_hash(config)
    model.target, model.marker = "slow", marker
    model.slow_hashes[marker] = digest
    model.hashes[digest] = marker

    def dynamic() -> dict[str, object]:
        doc = agent.doc("/v1/config")
        return dict(doc["dynamic"] or {})

    def on_trial() -> dict[str, object] | None:
        dyn = dynamic()
        trial = dyn.get("trial") or {}
        return dyn if isinstance(trial, dict) and trial.get("hash") == digest else None

    dyn = inv.wait_for(on_trial, SETTLE_BOUND)
    if dyn is None:
        return f"NodeAgentConfig {NAC_NAME} slow-to-fail (hash {digest}): never seen on trial"
    lkg = dyn.get("last_known_good")
    model.slow_lkg[marker] = str(lkg["hash"]) if isinstance(lkg, dict) else "local"
    p.set_inventory(devices)

    def rolled_back() -> bool | None:
        return dynamic().get("reason") == "RolledBack" or None

    took = time.monotonic()
    done = inv.wait_for(rolled_back, TRIAL_DURATION + SETTLE_BOUND)
    took = time.monotonic() - took
    return (
        f"NodeAgentConfig {NAC_NAME} slow-to-fail (hash {digest}): {config}; on trial, "
        f"inventory of {p.driver} -> {len(devices)} devices, "
        + (f"rolled back {took:.1f} s later" if done else f"not rolled back in {took:.0f} s")
        + f" (last-known-good {model.slow_lkg[marker]})"
    )


def _new_report_a(inv: Invariants, rng: random.Random) -> bool:
    """A running node-a reporter's new value, so the agent writes its reporter checkpoint
    (False: none running)."""
    running = [r for r in inv.world.reporters if r.running and r.node == "node-a"]
    if not running:
        return False
    r = rng.choice(running)
    r.set_inventory(report(r.driver, f"s{inv.step}"))
    return True


def _can_mount(inv: Invariants) -> bool:
    # A bind mount needs root (the soak in CI runs as root); elsewhere the event never applies.
    return os.geteuid() == 0 and shutil.which("mount") is not None


READ_ONLY = "Read-only file system"  # EROFS, as the agent reports a failed write
FULL = "No space left on device"  # ENOSPC


def _state_fault(inv: Invariants, rng: random.Random, fault: str | None) -> str:
    """node-a's state now unwritable with `fault` (None: writable again), then a node-a
    reporter's new value, so the agent writes its reporter checkpoint: it keeps running and
    reports the write it could not make, or the problem is gone once a write went through."""
    model = inv.model
    model.state_fault = fault
    if fault is not None:
        model.unsaved = True  # a dynconfig state write may fail now, retried once writable
    if fault is not None and model.target in ("good", "crash"):
        model.deferred = True  # a config assigned a moment ago may not have started its trial
    model.write_tried = _new_report_a(inv, rng)
    return f"(write tried: {model.write_tried})"


def state_read_only(inv: Invariants, rng: random.Random) -> str:
    """node-a's checkpoint directory made read-only (a remounted disk)."""
    inv.world.set_read_only("node-a", True)
    return "node-a's checkpoint directory read-only " + _state_fault(inv, rng, READ_ONLY)


def state_writable(inv: Invariants, rng: random.Random) -> str:
    inv.world.set_read_only("node-a", False)
    return "node-a's checkpoint directory writable again " + _state_fault(inv, rng, None)


def state_full(inv: Invariants, rng: random.Random) -> str:
    """node-a's state file system filled up by someone else's file (ENOSPC)."""
    inv.world.set_full("node-a", True)
    return "node-a's state file system full " + _state_fault(inv, rng, FULL)


def state_freed(inv: Invariants, rng: random.Random) -> str:
    inv.world.set_full("node-a", False)
    return "node-a's state file system freed " + _state_fault(inv, rng, None)


def _may_break_state(inv: Invariants) -> bool:
    """Not while the state is already unwritable (one fault at a time). A crash-inducing config
    may be pending: its trial is deferred until the state can be written (607b45e)."""
    ready = inv.world.checkpoints("node-a").is_dir()  # made by the agent's first start
    return not inv.world.faulty() and ready and _can_mount(inv)


def config_delete(inv: Invariants, rng: random.Random) -> str:
    status, got = inv.world.admin("DELETE", f"{NAC_PATH}/{NAC_NAME}")
    if status not in (200, 202):
        raise ApiDown(f"NodeAgentConfig delete: {status} {got}")
    inv.model.target = None
    return f"NodeAgentConfig {NAC_NAME} deleted"


def node_recreate(inv: Invariants, rng: random.Random) -> str:
    """node-a's Node deleted and created again (a new UID, no condition): the agent re-owns
    its slices and writes its condition on the new Node."""
    status, got = inv.world.admin("DELETE", "/api/v1/nodes/node-a")
    if status != 200:
        raise ApiDown(f"Node delete: {status} {got}")
    inv.world.ensure_node("node-a")
    return "Node node-a deleted and created again"


def foreign_create(inv: Invariants, rng: random.Random) -> str:
    """A ResourceSlice of another driver on node-a, not the agent's (no managed-by label)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": FOREIGN},
        "spec": {
            "driver": "foreign.soak.io",
            "nodeName": "node-a",
            "pool": {"name": "foreign", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "f-0"}],
        },
    }
    status, got = inv.world.admin("POST", SLICES_PATH, body)
    if status != 201:
        raise ApiDown(f"foreign slice create: {status} {got}")
    inv.model.foreign_rv = got["metadata"]["resourceVersion"]
    return f"foreign ResourceSlice {FOREIGN} created"


def foreign_delete(inv: Invariants, rng: random.Random) -> str:
    status, got = inv.world.admin("DELETE", f"{SLICES_PATH}/{FOREIGN}")
    if status != 200:
        raise ApiDown(f"foreign slice delete: {status} {got}")
    inv.model.foreign_rv = None
    return f"foreign ResourceSlice {FOREIGN} deleted"


TABLE = (
    Event("plugin_kill", 3, lambda inv: bool(_running(inv)), plugin_kill),
    Event("plugin_start", 4, lambda inv: bool(_stopped(inv)), plugin_start),
    Event("plugin_upgrade", 2, lambda inv: bool(_running(inv)), plugin_upgrade),
    Event("plugin_inventory", 4, lambda inv: bool(_running(inv)), plugin_inventory),
    Event(
        "reporter_kill", 2, lambda inv: any(r.running for r in inv.world.reporters), reporter_kill
    ),
    Event(
        "reporter_start",
        2,
        lambda inv: any(not r.running for r in inv.world.reporters),
        reporter_start,
    ),
    Event(
        "reporter_report",
        2,
        lambda inv: any(r.running for r in inv.world.reporters),
        reporter_report,
    ),
    Event("agent_sigterm", 2, lambda inv: True, agent_sigterm),
    Event("agent_sigkill", 2, lambda inv: True, agent_sigkill),
    Event(
        "agent_kill_during_write",
        1,
        lambda inv: any(p.node == "node-a" for p in _running(inv)),
        agent_kill_during_write,
    ),
    Event("watch_cut", 3, lambda inv: True, watch_cut),
    Event("apiserver_restart", 1, lambda inv: True, apiserver_restart),
    Event("config_good", 3, lambda inv: True, config_good),
    Event("config_invalid", 1, lambda inv: True, config_invalid),
    Event("config_crash", 1, lambda inv: True, config_crash),
    Event(
        "config_slow",
        1,
        lambda inv: not inv.world.faulty() and any(p.node == "node-a" for p in _running(inv)),
        config_slow,
    ),
    Event("state_read_only", 1, _may_break_state, state_read_only),
    Event("state_writable", 2, lambda inv: bool(inv.world.read_only), state_writable),
    Event(
        "state_full",
        1,
        lambda inv: _may_break_state(inv) and "node-a" in inv.world.small_disk,
        state_full,
    ),
    Event("state_freed", 2, lambda inv: bool(inv.world.full), state_freed),
    Event("config_delete", 1, lambda inv: inv.model.target is not None, config_delete),
    Event("node_recreate", 1, lambda inv: True, node_recreate),
    Event("foreign_create", 1, lambda inv: inv.model.foreign_rv is None, foreign_create),
    Event("foreign_delete", 1, lambda inv: inv.model.foreign_rv is not None, foreign_delete),
)


def draw(inv: Invariants, rng: random.Random) -> Event:
    """An event from the weighted table that applies now."""
    while True:
        event = rng.choices(TABLE, weights=[e.weight for e in TABLE])[0]
        if event.applies(inv):
            return event
