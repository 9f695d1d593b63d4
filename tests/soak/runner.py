"""The soak's run: the world started, a seeded schedule of events drawn from the table, the
invariants checked between them, and the summary (events by kind, events per hour, invariant
checks run, violations)."""

from __future__ import annotations

import random
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.soak.events import draw
from tests.soak.invariants import Invariants, Model
from tests.soak.world import World, inventory

BURST = 0.25  # the chance that the next event comes before the world has settled
QUIET_MAX = 4.0  # seconds of continuous checks after the world settled, at most


@dataclass
class Summary:
    seed: int
    seconds: float
    events: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    settle_max: float = 0.0
    writes_per_minute: list[tuple[int, int, int]] = field(default_factory=list)
    flat: str = ""  # the long-lived agent's (node-b's) RSS and open files, baseline to end

    def lines(self) -> list[str]:
        n = sum(self.events.values())
        per_hour = n / self.seconds * 3600 if self.seconds else 0.0
        busiest = max(self.writes_per_minute, key=lambda r: r[1], default=(0, 0, 0))
        out = [
            f"soak summary: seed {self.seed}, {self.seconds:.0f} s, {n} events "
            f"({per_hour:.0f} per hour), slowest convergence {self.settle_max:.1f} s, "
            f"busiest minute {busiest[1]} writes ({busiest[2]} events)",
            "events: " + ", ".join(f"{k} {v}" for k, v in sorted(self.events.items())),
            f"invariant checks: {sum(self.checks.values())} ("
            + ", ".join(f"{k} {v}" for k, v in sorted(self.checks.items()))
            + ")",
            "writes per minute (events of the minute and the one before): "
            + ", ".join(f"{w}/{e}" for _, w, e in self.writes_per_minute),
            f"node-b's agent (never restarted): {self.flat}",
            f"violations: {len(self.violations)}",
        ]
        return out


def run(
    seed: int, duration: float, workdir: Path | None = None, out: Callable[[str], None] = print
) -> Summary:
    """Run the soak for ``duration`` seconds of events; the summary (violations printed as
    they are found)."""
    rng = random.Random(seed)
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"soak-{seed}-"))
    out(f"soak: seed {seed}, duration {duration:g} s, work directory {workdir}")
    world = World.start(workdir)
    started = time.monotonic()
    summary = Summary(seed, 0.0)
    try:
        world.add_plugin("node-a", "gpu.soak.io", inventory(40, "s0"))
        world.add_plugin("node-a", "nic.soak.io", inventory(129, "s0"))
        world.add_plugin("node-b", "gpu.soak.io", inventory(3, "s0"))
        world.add_reporter("node-a", "alpha", "s0")
        world.add_reporter("node-a", "beta", "s0")
        world.add_reporter("node-b", "alpha", "s0")
        world.start_agent("node-a")
        world.start_agent("node-b")
        inv = Invariants(world, Model(), seed, out)
        took = inv.settle(time.monotonic())
        summary.settle_max = took or 0.0
        step = 0
        end = time.monotonic() + duration
        while time.monotonic() < end:
            step += 1
            event = draw(inv, rng)
            inv.at_event(step, event.name)
            at = time.monotonic()
            try:
                what = event.run(inv, rng)
            except Exception:  # an event that could not be done is a finding too
                inv.violation("event done", traceback.format_exc(limit=3))
                what = "failed"
            summary.events[event.name] += 1
            done = time.monotonic()  # after a restart of the apiserver: it serves again
            out(f"step {step} +{at - started:.0f}s {event.name}: {what}")
            if rng.random() < BURST:
                inv.watch(rng.uniform(0.0, 1.0))  # the next event before the world settles
                continue
            took = inv.settle(done)
            if took is not None:
                summary.settle_max = max(summary.settle_max, took)
            inv.watch(rng.uniform(0.0, QUIET_MAX))
        inv.at_event(step, "end")
        inv.event_times.pop()
        inv.settle(time.monotonic())
        summary.writes_per_minute = inv.writes_per_minute()
        summary.checks = inv.checks
        rec = inv.records.get(world.agents["node-b"].run)
        if rec is not None and rec.baseline is not None and rec.samples:
            base, last = rec.baseline, rec.samples[-1]
            summary.flat = (
                f"RSS {base.rss >> 20} -> {last.rss >> 20} MiB, "
                f"open files {base.fds} -> {last.fds}, over {last.at - base.at:.0f} s"
            )
        summary.violations = inv.violations
    finally:
        summary.seconds = time.monotonic() - started
        world.close()
    for line in summary.lines():
        out(line)
    return summary
