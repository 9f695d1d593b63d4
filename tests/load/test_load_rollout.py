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
from collections.abc import Collection
from typing import Any

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


def _events(run: Run, skip: Collection[str] = ()) -> list[dict[str, Any]]:
    """The object's Events but those named in ``skip`` (an earlier rollout's)."""
    return [e for e in events(run.srv) if e["metadata"]["name"] not in skip]


def _waves(found: list[dict[str, Any]]) -> list[int]:
    """The wave of each WaveStarted Event ("wave N: ...")."""
    return sorted(
        int(e["message"].split(":", 1)[0].split()[1]) for e in found if e["reason"] == "WaveStarted"
    )


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
        expected = {"RolloutStarted": 1, "WaveStarted": 5, "RolloutComplete": 1}

        def good_events() -> list[dict[str, Any]] | NotYet:
            found = _events(run)
            reasons = collections.Counter(e["reason"] for e in found)
            return found if reasons == expected else NotYet(reasons)

        # Posted after the status writes that decided them: waited for, then exactly these.
        found = until(good_events, "the good rollout's Events", timeout=60)
        assert _waves(found) == [0, 1, 2, 3, 4]  # the canary, then each wave once
        # Two controllers ran all along: only the leader wrote and posted.
        after = {c.identity: c.metrics()["writes"] for c in run.controllers}
        wrote = {i for i in after if after[i] > before[i]}
        assert wrote == {first.identity}, (before, after)
        assert {e["reportingInstance"] for e in found} == {first.identity}
        assert admissions_went_back(run.recorder.history(), good) == []
        first_events = {e["metadata"]["name"] for e in found}

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
        assert run.outside(bad) == set()
        assert admissions_went_back(run.recorder.history(), bad) == []

        def halt_event() -> list[dict[str, Any]] | NotYet:
            found = _events(run, first_events)
            reasons = [e["reason"] for e in found]
            return found if "RolloutHalted" in reasons else NotYet(reasons)

        found = until(halt_event, "the RolloutHalted Event", timeout=60)
        counted = collections.Counter(e["reason"] for e in found)
        assert counted["RolloutStarted"] == 1 and counted["RolloutHalted"] == 1, counted
        # No wave started twice across the takeover (a kill between a status write and its
        # Event may lose that Event; the status, not the Event, is the record).
        waves = _waves(found)
        assert len(waves) == len(set(waves)) and set(waves) <= set(range(halted.rollout.wave + 1))
        # The nodes that never got it still run the good config.
        tried_bad = tried(run.recorder.conditions, NAME, bad)
        untouched = [a.node for a in run.fleet.agents if a.node not in tried_bad]
        assert untouched or halted.rollout.admitted == AGENTS, halted
        assert all(active_hash(run.fleet, n) == good for n in untouched)

        # 3. Abort: every node back on the good config (the one before the rollout).
        patch_rollout(run.srv, abort=True)
        run.wait_phase(bad, {"Aborted"}, timeout=60)
        until(lambda: _all_run(run, good), "every node back on the good config", timeout=120)
        until(
            lambda: "RolloutAborted" in [e["reason"] for e in _events(run, first_events)],
            "the RolloutAborted Event",
        )
