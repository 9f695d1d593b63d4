"""The soak in the normal suite: a short seeded run (NODEAGENT_SOAK_SECONDS, default 120) on the
real apiserver with zero invariant violations; and the invariants' own checks fed broken input,
so none of them is one that cannot fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.soak.crash_agent import CRASH_EXIT
from tests.soak.events import check_resumed
from tests.soak.invariants import (
    FOREIGN,
    Invariants,
    Model,
    crash_difference,
    owner_difference,
    plugin_difference,
    pool_problems,
    published,
    reporter_difference,
    slow_difference,
    state_difference,
    stop_agent,
    writes_of,
)
from tests.soak.runner import run
from tests.soak.world import Plugin, inventory, report

SEED = 29  # fixed: the suite's verdict is the code's, not the draw's


def _slice(name: str, gen: int, count: int, devices: list[str], driver: str = "d") -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": gen, "resourceSliceCount": count},
            "devices": [{"name": d, "attributes": {"model": {"string": "t"}}} for d in devices],
        },
    }


def test_an_incomplete_pool_is_seen() -> None:
    complete = [_slice("a", 2, 2, ["x"]), _slice("b", 2, 2, ["y"])]
    assert pool_problems(complete) == []
    assert pool_problems([_slice("a", 2, 2, ["x"])])  # one of two slices
    assert pool_problems([_slice("a", 1, 1, ["x"]), _slice("b", 2, 1, ["y"])])  # two generations
    assert pool_problems([_slice("a", 2, 2, ["x"]), _slice("b", 2, 2, ["x"])])  # a device twice


def test_a_plugin_not_published_is_seen(tmp_path: Path) -> None:
    plugin = Plugin("node-a", "d", "/nonexistent", tmp_path / "inv.json")
    plugin.set_inventory(inventory(2, "t"))
    published_ok = [_slice("a", 1, 1, ["dev-0", "dev-1"])]
    slices = [*published_ok, _slice(FOREIGN, 1, 1, ["f"])]
    assert plugin_difference(plugin, published(slices, "node-a", "d")) is None
    assert plugin_difference(plugin, published([_slice("a", 1, 1, ["dev-0"])], "node-a", "d"))
    plugin.set_inventory(inventory(2, "u"))  # same names, another model: not yet published
    assert plugin_difference(plugin, published(slices, "node-a", "d"))


def test_a_slice_of_the_old_node_is_seen() -> None:
    s = _slice("a", 1, 1, ["x"])
    s["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "nodeagent"}
    s["metadata"]["ownerReferences"] = [{"kind": "Node", "uid": "old"}]
    assert owner_difference("node-a", "old", [s]) is None
    assert owner_difference("node-a", "new", [s])


def test_writes_are_counted_from_the_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE nodeagent_resourceslice_writes_total counter",
            'nodeagent_resourceslice_writes_total{verb="create",result="ok"} 3',
            'nodeagent_resourceslice_dry_runs_total{result="ok"} 1',
            'nodeagent_cnr_writes_total{verb="none",result="ok"} 7',
            'nodeagent_cnr_writes_total{verb="apply",result="ok"} 2',
            'nodeagent_node_events_total{result="created"} 1',
            'nodeagent_node_events_total{result="dropped"} 5',
            'nodeagent_watch_events_total{resource="nodes"} 100',
        ]
    )
    assert writes_of(text, {"dynconfig": {"condition_writes": 4}}) == 3 + 1 + 2 + 1 + 4


def test_writes_over_the_bound_are_a_violation() -> None:
    lines: list[str] = []
    inv = Invariants(None, Model(), 7, lines.append)  # type: ignore[arg-type]  # no world read
    inv.started -= 61
    inv.write_log.append((inv.started + 1, 10_000))
    rows = inv.writes_per_minute()
    assert rows == [(0, 10_000, 0)]
    assert len(inv.violations) == 1 and "--seed 7" in lines[0], lines


def test_a_crash_inducing_config_not_rolled_back_is_seen() -> None:
    named = {"reason": "RolledBack", "message": "NodeAgentConfig soak (hash abc) rolled back"}
    assert crash_difference(0.9, "abc", 0.3, named) == []
    assert crash_difference(0.9, "abc", 0.9, named)  # still running it
    assert crash_difference(0.9, "abc", 0.3, None)  # no condition
    assert crash_difference(0.9, "abc", 0.3, {**named, "reason": "Active"})
    assert crash_difference(0.9, "def", 0.3, named)  # another config named


def test_a_slow_config_not_rolled_back_as_it_must_be_is_seen() -> None:
    model = Model(slow_hashes={0.8: "abc"}, slow_lkg={0.8: "def"}, hashes={"def": 0.3})
    why = "component resources not ready for 10s (bound 10s): pool p of driver d not published"
    named = {
        "reason": "RolledBack",
        "message": f"NodeAgentConfig soak (hash abc) rolled back: {why}; running ...",
    }
    assert slow_difference(model, 0.8, "def", 0.3, named) == []
    assert slow_difference(model, 0.8, "abc", 0.8, named)  # still running it
    assert slow_difference(model, 0.8, "def", 0.3, None)  # no condition
    assert slow_difference(model, 0.8, "def", 0.3, {**named, "reason": "OnTrial"})
    crashed = {**named, "message": "NodeAgentConfig soak (hash abc) rolled back: it died"}
    assert slow_difference(model, 0.8, "def", 0.3, crashed)  # another reason named
    assert slow_difference(model, 0.8, "local", 0.2, named)  # not its last-known-good
    model.slow_lkg[0.8] = "local"
    assert slow_difference(model, 0.8, "local", 0.2, named) == []
    model.slow_lkg[0.8] = "ghi"  # a last-known-good the soak never assigned as good
    assert slow_difference(model, 0.8, "ghi", 0.3, named)
    model.hashes["ghi"], model.invalid_markers = 0.6, {0.6}  # an invalid config's
    assert slow_difference(model, 0.8, "ghi", 0.6, named)


def test_a_reporter_missing_from_the_cnr_or_left_past_its_grace_is_seen(tmp_path: Path) -> None:
    r = Plugin("node-a", "alpha", "/nonexistent", tmp_path / "r.json", kind="reporter")
    r.set_inventory(report("alpha", "s1"))
    r.proc = subprocess.Popen(["sleep", "30"])  # a running reporter, as far as the check goes
    try:
        here = {"soak.nodeagent.io/alpha": "s1", "other": "x"}
        assert reporter_difference(r, here, 0.0) is None
        assert reporter_difference(r, {}, 0.0)  # not in the CNR
        assert reporter_difference(r, {"soak.nodeagent.io/alpha": "s0"}, 0.0)  # an old value
    finally:
        r.stop()
    assert reporter_difference(r, {}, 0.0) is None  # stopped, gone
    assert reporter_difference(r, here, 0.0)  # stopped, still there


def test_an_unwritable_state_not_reported_or_not_recovered_is_seen() -> None:
    ro, full = "Read-only file system", "No space left on device"
    failed = [f"checkpoint reporter_manager_checkpoint not written: {ro}"]
    assert state_difference(ro, True, failed) is None
    assert state_difference(ro, True, [])  # a write failed and nothing says so
    assert state_difference(full, True, failed)  # the disk is full, the problem says otherwise
    assert state_difference(ro, False, []) is None  # nothing tried to write yet
    assert state_difference(None, True, []) is None
    assert state_difference(None, True, failed)  # written again, the problem still shown


def test_the_dynconfig_state_not_written_once_writable_is_seen() -> None:
    """Issue 29 item 1: its failed write is retried until it succeeds, no config change
    needed."""
    failed = ["checkpoint dynconfig_state not written: Read-only file system"]
    assert state_difference("Read-only file system", False, failed) is None
    assert state_difference(None, False, failed)


def test_a_config_deferred_leaves_the_running_trial_at_risk() -> None:
    """Seed 7 step 444: 0.3874 on trial, the state read-only, 0.3884 assigned (deferred), the
    agent SIGKILLed: a rollback of 0.3874 is the soak's doing. A config seen on trial stays a
    candidate while the agent shows no other trial and none ended (Active, Local)."""
    model = Model(hashes={"h1": 0.3874, "h2": 0.3884})
    model.saw_trial({"reason": "OnTrial", "trial": {"hash": "h1"}})
    model.last_good = 0.3884
    model.saw_trial({"reason": "TrialDeferred", "trial": None})
    assert model.trial_candidates() == {0.3874, 0.3884}
    model.saw_trial({"reason": "OnTrial", "trial": {"hash": "h2"}})  # its trial recorded
    assert model.trial_candidates() == {0.3884}
    model.saw_trial({"reason": "Active", "trial": None})
    assert model.trial_candidates() == {0.3884}  # the last assigned, as before


def test_a_trial_not_resumed_after_a_clean_stop_while_unwritable_is_seen() -> None:
    boot: dict[str, Any] = {}
    agent = SimpleNamespace(doc=lambda path: {"dynamic": {"boot": boot}})
    world = SimpleNamespace(agents={"node-a": agent}, plugins=[], reporters=[])
    lines: list[str] = []
    inv = Invariants(world, Model(), 7, lines.append)  # type: ignore[arg-type]  # no world read
    trial: dict[str, object] = {"hash": "h1", "remaining": 12.0}
    boot.update(source="resumed", reason="... (from the runtime directory (...)): resumed")
    check_resumed(inv, trial)
    assert not inv.violations
    boot.update(source="rollback", reason="the agent died during its trial: h1")
    check_resumed(inv, trial)
    assert len(inv.violations) == 1 and "rollback" in lines[0], lines


def test_an_induced_crash_racing_a_sigterm_is_not_an_unclean_stop() -> None:
    """Seed 7 step 824 (the 2-hour run): a crash-inducing config assigned, the agent SIGTERMed
    a moment later, as it exited on the config itself (status 70): the induced crash, once."""
    log = "soak-crash: plugins.scan_interval 0.9646: crashing"
    agent = SimpleNamespace(stop=lambda signum: CRASH_EXIT, log_tail=lambda: log, run=135)
    world = SimpleNamespace(agents={"node-a": agent}, plugins=[], reporters=[])
    lines: list[str] = []
    model = Model(crash_hashes={0.9646: "3cfbf4dfabb20ef8"})
    inv = Invariants(world, model, 7, lines.append)  # type: ignore[arg-type]  # no world read
    stop_agent(inv, "node-a", signal.SIGTERM)
    assert not inv.violations and model.crash_exits[0.9646] == 1, lines
    stop_agent(inv, "node-a", signal.SIGTERM)  # the same config again: it ran once more
    assert len(inv.violations) == 1 and "not run again" in lines[-1], lines
    agent.log_tail = lambda: "no hook"
    stop_agent(inv, "node-a", signal.SIGTERM)  # exit 70 of no crash-inducing config
    assert len(inv.violations) == 2 and "clean stop" in lines[-1], lines


def test_a_crash_config_drawn_again_later_may_crash_the_agent_once_more() -> None:
    """Seed 7 step 1326 (the 2-hour run): the marker 0.9652 drawn at step 326 and again at
    step 1326, a new generation of the object: the agent tries it once more, which is no
    violation; a second exit on that assignment still is."""
    log = "soak-crash: plugins.scan_interval 0.9652: crashing"
    agent = SimpleNamespace(stop=lambda signum: CRASH_EXIT, log_tail=lambda: log, run=209)
    world = SimpleNamespace(agents={"node-a": agent}, plugins=[], reporters=[])
    lines: list[str] = []
    model = Model()
    inv = Invariants(world, model, 7, lines.append)  # type: ignore[arg-type]  # no world read
    model.crash_assigned(0.9652, "4c5ab5110dd506df")
    stop_agent(inv, "node-a", signal.SIGTERM)
    model.crash_assigned(0.9652, "4c5ab5110dd506df")  # drawn again, 1,000 steps later
    stop_agent(inv, "node-a", signal.SIGTERM)
    assert not inv.violations, lines
    stop_agent(inv, "node-a", signal.SIGTERM)
    assert len(inv.violations) == 1 and "not run again" in lines[-1], lines


def test_a_plugin_that_exited_by_itself_is_seen(tmp_path: Path) -> None:
    lines: list[str] = []
    plugin = Plugin("node-a", "d", "/nonexistent", tmp_path / "inv.json")
    world = SimpleNamespace(plugins=[plugin], reporters=[])
    inv = Invariants(world, Model(), 7, lines.append)  # type: ignore[arg-type]  # no world read
    plugin.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    plugin.proc.wait()
    inv.plugins_run()
    inv.plugins_run()  # reported once
    assert len(inv.violations) == 1 and "exited 3 unasked" in lines[0], lines
    assert not plugin.running


def test_seeded_soak(tmp_path: Path) -> None:
    seconds = float(os.environ.get("NODEAGENT_SOAK_SECONDS", "120"))
    lines: list[str] = []
    summary = run(SEED, seconds, tmp_path / "soak", out=lines.append)
    print("\n".join(lines))
    assert sum(summary.events.values()) > 0, lines
    assert summary.checks["converges within the bound"] >= sum(summary.events.values()) // 2
    assert not summary.violations, "\n".join(lines)
