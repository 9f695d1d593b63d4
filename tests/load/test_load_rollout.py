"""A configuration rollout through a small fleet in CI (tests/load/rollout.py): 12 real agents
(node identities, 3-second trials), two real `nodeagent rollout-controller` processes (one Lease)
and the real apiserver, judged from every NodeAgentConfigOK condition change and every
status.rollout the recorder saw:

- a good config goes through the canary and 4 waves to Complete, never more than maxUnavailable
  nodes on trial at once, every node running it, and only the leader writing;
- a config that fails its trial on 3 of the nodes halts once 2 rolled back, and no node the
  status never admitted tried it, though the leader was killed mid-rollout (the other
  controller took over and went on from the status: no Event twice, no admission taken back);
- abort returns every node to the good config.

The 100-agent run: `python -m tests.load.rollout --agents 100` (docs/testing/load.md)."""

from __future__ import annotations

import collections
import pathlib

import pytest

from tests.load.rollout import (
    BAD_FIELD,
    BAD_VALUE,
    NAME,
    ROLLOUT,
    Run,
    active_hash,
    admissions_went_back,
    config_hash_of,
    events,
    fleet_run,
    leader,
    patch_rollout,
    put_config,
    rollout_figures,
    tried,
)
from tests.support.wait import NotYet, until

pytestmark = pytest.mark.integration

AGENTS = 12
BAD_NODES = (4, 7, 10)  # not the canary (node 0)
GOOD = {"plugins": {"scan_interval": 0.5}}
table, _, key = BAD_FIELD.partition(".")
BAD = {table: {key: BAD_VALUE}}


def _event_reasons(run: Run, since: int) -> list[str]:
    return [e["reason"] for e in events(run.srv)[since:]]


def _all_run(run: Run, config_hash: str) -> bool | NotYet:
    hashes = {a.node: active_hash(run.fleet, a.node) for a in run.fleet.agents}
    wrong = {n: h for n, h in hashes.items() if h != config_hash}
    return True if not wrong else NotYet(wrong)


def test_a_rollout_through_a_fleet(tmp_path: pathlib.Path) -> None:
    with fleet_run(AGENTS, tmp_path, bad=BAD_NODES) as run:
        first = until(lambda: leader(run.controllers), "one controller leads", timeout=60)
        before = {c.identity: c.metrics()["writes"] for c in run.controllers}

        # 1. A good config: canary, 4 waves, Complete; at most maxUnavailable on trial at once.
        fig = rollout_figures(run, GOOD, timeout=300)
        good = config_hash_of(GOOD)
        assert fig["waves"] == 4, fig
        assert 1 <= fig["peak_on_trial"] <= ROLLOUT["maxUnavailable"], fig
        assert fig["outside_admitted"] == [], fig
        until(lambda: _all_run(run, good), "every node runs the good config", timeout=60)
        status = run.recorder.status()
        assert status is not None
        counts = status.rollout.counts
        assert (counts.targeted, counts.active, counts.rolled_back) == (AGENTS, AGENTS, 0)
        reasons = _event_reasons(run, 0)
        assert collections.Counter(reasons) == {
            "RolloutStarted": 1,
            "WaveStarted": 5,  # the canary and each of the 4 waves
            "RolloutComplete": 1,
        }, reasons
        # Two controllers ran all along: only the leader wrote.
        after = {c.identity: c.metrics()["writes"] for c in run.controllers}
        wrote = {i for i in after if after[i] > before[i]}
        assert wrote == {first.identity}, (before, after)
        assert admissions_went_back(run.recorder.history(), good) == []
        seen_events = len(reasons)

        # 2. A config that fails its trial on BAD_NODES: the leader killed once the canary
        # passed; the other takes over from the status; the rollout halts at 2 rolled back.
        bad = config_hash_of(BAD)
        put_config(run.srv, BAD, ROLLOUT)

        def past_canary() -> int | NotYet:
            seen = run.recorder.status()
            if seen is None or seen.rollout.config_hash != bad or seen.rollout.wave < 1:
                return NotYet(seen and seen.rollout)
            return seen.rollout.wave

        until(past_canary, "the bad config's first wave", timeout=120)
        first.kill()
        second = until(lambda: leader(run.controllers), "the other controller leads", timeout=60)
        assert second is not first
        first.start()  # back as a follower
        halted = run.wait_phase(bad, {"Halted"}, timeout=300)
        assert halted.rollout.counts.rolled_back >= 2, halted
        assert halted.rollout.admitted < AGENTS, halted
        assert run.outside(bad) == set()
        assert admissions_went_back(run.recorder.history(), bad) == []
        reasons = _event_reasons(run, seen_events)
        counted = collections.Counter(reasons)
        assert counted["RolloutStarted"] == 1 and counted["RolloutHalted"] == 1, reasons
        assert counted["WaveStarted"] == halted.rollout.wave + 1, reasons
        # The nodes that never got it still run the good config.
        tried_bad = tried(run.recorder.conditions, NAME, bad)
        untouched = [a.node for a in run.fleet.agents if a.node not in tried_bad]
        assert untouched and all(active_hash(run.fleet, n) == good for n in untouched)

        # 3. Abort: every node back on the good config (the one before the rollout).
        patch_rollout(run.srv, abort=True)
        run.wait_phase(bad, {"Aborted"}, timeout=60)
        until(lambda: _all_run(run, good), "every node back on the good config", timeout=120)
        assert "RolloutAborted" in _event_reasons(run, seen_events)
