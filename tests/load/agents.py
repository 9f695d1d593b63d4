"""Load: many agents against one apiserver. Runs N `nodeagent run` processes, each with its own
node identity, Node, state directory, registry and DRA plugin process, against one real
kube-apiserver (the test harness, with an audit log), and measures what the agents cost the
apiserver and the node:

    python -m tests.load.agents --agents 100 --steady 300 [--restart] \\
        [--set 'kube.streaming_list="off"']

- steady state: the agents' requests per agent per minute (from the audit log, by verb and
  resource), watches open per agent (the apiserver's gauge, and each agent's TCP connections to
  it), RSS and CPU per agent and per plugin;
- with --restart, after the steady window: the apiserver restarted (etcd kept), then the full
  lists the agents make (relists: LIST or streaming-list watches), their request burst, how long
  agents were not ready, and the time until every agent has re-opened all its watches.

It prints a table (and --json FILE writes the figures). Heavy: 2 processes per agent; run it
once on a shared machine, not in a loop.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.load.fleet import (
    Fleet,
    Request,
    agent_counts,
    apiserver_watches,
    audit_log,
    connections_to,
    is_list,
    node_names,
    open_at,
    prepare_cluster,
    read_audit,
    rss_mib,
    start_audited_apiserver,
)

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


@dataclass
class Readiness:
    """Polls every agent's /readyz in a thread while the apiserver restarts: for each agent,
    when it was last seen not ready."""

    fleet: Fleet
    interval: float = 0.5
    last_not_ready: dict[str, float] = field(default_factory=dict)
    ever_not_ready: set[str] = field(default_factory=set)
    # Each agent's first reason for not being ready (its failing /readyz lines).
    reasons: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            for a in self.fleet.agents:
                if (reason := a.readyz_reason(timeout=1.0)) is not None:
                    self.last_not_ready[a.node] = time.time()
                    self.ever_not_ready.add(a.node)
                    self.reasons.setdefault(a.node, reason)
            self._stop.wait(self.interval)

    def __enter__(self) -> Readiness:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _watch_key(r: Request) -> str:
    q = parse_qs(urlsplit(r.uri).query)
    sel = ",".join(q.get("fieldSelector", []) + q.get("labelSelector", []))
    return f"{r.resource}?{sel}"


def _per_minute(count: int, agents: int, seconds: float) -> float:
    return count / agents / (seconds / 60)


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def steady_figures(reqs: list[Request], agents: int, t0: float, t1: float) -> dict[str, Any]:
    window = [r for r in reqs if t0 <= r.received < t1]
    seconds = t1 - t0
    by_kind = collections.Counter(f"{r.verb} {r.resource}" for r in window)
    per_agent = collections.Counter(r.user for r in window)
    watches = collections.Counter(r.user for r in reqs if open_at(r, t1))
    return {
        "window_s": round(seconds, 1),
        "requests_per_agent_per_min": round(_per_minute(len(window), agents, seconds), 2),
        "by_kind_per_agent_per_min": {
            k: round(_per_minute(v, agents, seconds), 3) for k, v in by_kind.most_common()
        },
        "busiest_agent_per_min": round(max(per_agent.values(), default=0) / (seconds / 60), 2),
        "watches_open_per_agent": _stats([watches.get(u, 0) for u in set(per_agent) | set(watches)])
        if watches
        else None,
        "relists": sum(1 for r in window if is_list(r)),
        "errors": dict(collections.Counter(str(r.code) for r in window if r.code >= 400)),
    }


def watches_open(reqs: list[Request], t: float) -> dict[str, set[str]]:
    """Each agent's watches (resource + selectors) open at ``t``."""
    opened: dict[str, set[str]] = collections.defaultdict(set)
    for r in reqs:
        if open_at(r, t):
            opened[r.user].add(_watch_key(r))
    return opened


def watches_reopened(
    reqs: list[Request], agents: list[str], t_restart: float, t_start: float, t_end: float
) -> dict[str, float]:
    """For each agent that has re-opened (on the new apiserver, by ``t_end``) every watch it
    had open at the restart: when its last one was accepted. A watch counts once it stayed open
    at least 1 s (a resume answered with a 410 ERROR event ends at once)."""
    opened = watches_open(reqs, t_restart)
    reopened: dict[str, float] = {}
    for a in agents:
        need = set(opened[a])
        for r in reqs:
            if r.user != a or not t_start <= r.received < t_end:
                continue
            if r.verb == "watch" and r.code < 400 and (r.completed or t_end) > r.received + 1:
                need.discard(_watch_key(r))
                if not need:
                    reopened[a] = r.received
                    break
    return reopened


def restart_figures(
    reqs: list[Request],
    agents: list[str],
    t_restart: float,
    t_start: float,
    t_up: float,
    t_end: float,
    steady_per_s: float,
    readiness: Readiness,
) -> dict[str, Any]:
    """``t_restart``: SIGTERM to the old apiserver; ``t_start``: the new process started (the
    old one has exited); ``t_up``: the new one answers /readyz. Recovery is timed from
    ``t_start``: agents reconnect as soon as the port accepts, before /readyz."""
    after = [r for r in reqs if t_start <= r.received < t_end]
    opened = watches_open(reqs, t_restart)
    reopened = watches_reopened(reqs, agents, t_restart, t_start, t_end)
    burst = [r for r in after if r.received < t_start + 60]
    per_second = collections.Counter(int(r.received - t_start) for r in burst)
    not_ready_until = [readiness.last_not_ready.get(a, t_start) for a in agents]
    return {
        "old_apiserver_stop_s": round(t_start - t_restart, 2),
        "new_apiserver_ready_s": round(t_up - t_start, 2),
        "watches_open_before_per_agent": round(
            sum(len(v) for v in opened.values()) / len(agents), 2
        ),
        "relists": sum(1 for r in after if is_list(r)),
        "relists_by_kind": dict(
            collections.Counter(f"{r.verb} {r.resource}" for r in after if is_list(r))
        ),
        "requests_first_60s": len(burst),
        "requests_first_60s_per_agent": round(len(burst) / len(agents), 2),
        "steady_requests_in_60s": round(steady_per_s * 60, 1),
        "peak_requests_per_s": max(per_second.values(), default=0),
        "burst_by_kind": dict(
            collections.Counter(f"{r.verb} {r.resource} {r.code}" for r in burst).most_common(12)
        ),
        "writes_first_60s": sum(1 for r in burst if r.verb in WRITE_VERBS),
        "errors_first_60s": dict(collections.Counter(str(r.code) for r in burst if r.code >= 400)),
        "agents_not_ready_during_restart": len(readiness.ever_not_ready),
        # The first reason of each, with the numbers taken out so that alike ones count as one.
        "not_ready_reasons": dict(
            collections.Counter(
                re.sub(r"\d+(\.\d+)?", "N", why)[:200]
                for why in getattr(readiness, "reasons", {}).values()
            ).most_common(5)
        ),
        "all_ready_after_start_s": round(max(0.0, max(not_ready_until) - t_start), 2),
        "agents_with_watches_back": len(reopened),
        "all_watches_back_after_start_s": (
            round(max(reopened.values()) - t_start, 2) if len(reopened) == len(agents) else None
        ),
        "watches_back_p50_s": (
            round(statistics.median(v - t_start for v in reopened.values()), 2)
            if reopened
            else None
        ),
    }


def run(
    agents: int,
    steady: float,
    settle: float,
    restart: bool,
    settings: list[str],
    workdir: pathlib.Path,
    batch: int = 10,
    after_restart: float = 60.0,
    devices: int = 4,
    kill: bool = False,
) -> dict[str, Any]:
    """The measurement; ``kill``: the restart is a crash (SIGKILL) instead of SIGTERM."""
    nodes = node_names(agents)
    t = time.monotonic()
    srv = start_audited_apiserver(workdir, nodes)
    out: dict[str, Any] = {
        "agents": agents,
        "restart_by": "kill" if kill else "term",
        "settings": settings,
        "apiserver": srv.version,
        "harness_start_s": round(time.monotonic() - t, 1),
    }
    fleet = Fleet(srv, nodes, settings=settings, devices=devices)
    try:
        prepare_cluster(srv, nodes)
        baseline_watches = apiserver_watches(srv)  # the apiserver's own (loopback) watches
        out["fleet_start_s"] = round(fleet.start(batch), 1)
        time.sleep(settle)  # let start-up writes (slices, CNR, conditions) settle
        pids = list(fleet.pids())
        cpu0 = [(cpu_seconds(ap), cpu_seconds(pp)) for _, ap, pp in pids]
        api_cpu0 = cpu_seconds(srv.apiserver_pid or 0)
        t0 = time.time()
        time.sleep(steady)  # the measurement window: the agents run undisturbed
        t1 = time.time()
        cpu1 = [(cpu_seconds(ap), cpu_seconds(pp)) for _, ap, pp in pids]
        counts0 = {a.node: agent_counts(a) for a in fleet.agents}
        api_cpu1 = cpu_seconds(srv.apiserver_pid or 0)
        watches = apiserver_watches(srv)
        conns = connections_to([ap for _, ap, _ in pids], srv.port)
        span = t1 - t0
        out["apiserver_watch_gauge_per_agent"] = round((watches - baseline_watches) / agents, 2)
        out["tcp_connections_per_agent"] = _stats(conns)
        out["agent_rss_mib"] = _stats([rss_mib(ap) for _, ap, _ in pids])
        out["plugin_rss_mib"] = _stats([rss_mib(pp) for _, _, pp in pids])
        pairs = list(zip(cpu0, cpu1, strict=True))
        out["agent_cpu_pct"] = _stats([100 * (b[0] - a[0]) / span for a, b in pairs])
        out["plugin_cpu_pct"] = _stats([100 * (b[1] - a[1]) / span for a, b in pairs])
        out["apiserver_cpu_pct"] = round(100 * (api_cpu1 - api_cpu0) / span, 1)
        out["apiserver_rss_mib"] = round(rss_mib(srv.apiserver_pid or 0), 1)
        if restart:
            with Readiness(fleet) as readiness:
                t_restart = time.time()
                if kill:
                    srv.kill_apiserver()
                else:
                    srv.stop_apiserver()  # waits up to 30 s for the old process, then kills it
                t_start = time.time()
                srv.start_apiserver()
                t_up = time.time()
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:  # every agent has re-opened its watches
                    back = watches_reopened(
                        read_audit(audit_log(srv)), nodes, t_restart, t_start, time.time()
                    )
                    if len(back) == len(nodes):
                        break
                    time.sleep(1)
                time.sleep(max(0.0, t_start + after_restart - time.time()))
                fleet.wait_ready(timeout=120)
            t_end = time.time()
        counts1 = {a.node: agent_counts(a) for a in fleet.agents}
        t_counted = time.time()
        fleet.stop()  # every watch ends: the audit log has them all
        reqs = read_audit(audit_log(srv))
        audited = collections.Counter(r.user for r in reqs if r.received <= t_counted)
        # The agents' own count against the apiserver's (requests in flight may differ by one).
        out["accounting"] = {n: (int(counts1[n]["requests"]), audited.get(n, 0)) for n in nodes}
        # After the steady window (the restart): what the agents counted, summed.
        out["agents_counted_after_steady"] = {
            k: sum(counts1[n].get(k, 0) - counts0[n].get(k, 0) for n in nodes)
            for k in sorted({k for c in counts1.values() for k in c})
        }
        out["steady"] = steady_figures(reqs, agents, t0, t1)
        if restart:
            steady_per_s = sum(1 for r in reqs if t0 <= r.received < t1) / span
            out["restart"] = restart_figures(
                reqs, nodes, t_restart, t_start, t_up, t_end, steady_per_s, readiness
            )
        return out
    finally:
        fleet.close()
        srv.close()


def table(fig: dict[str, Any]) -> str:
    s = fig["steady"]
    rows = [
        (
            "agents (each: own node identity, Node, state dir, registry, DRA plugin process)",
            fig["agents"],
        ),
        ("settings", " ".join(fig["settings"]) or "defaults"),
        (
            "start-up of the fleet (batches of 10, each ready before the next)",
            f"{fig['fleet_start_s']} s",
        ),
        (
            "steady requests per agent per minute (audit log)",
            f"{s['requests_per_agent_per_min']} (window {s['window_s']} s)",
        ),
        (
            "  by verb and resource",
            ", ".join(f"{k} {v}" for k, v in s["by_kind_per_agent_per_min"].items()),
        ),
        ("watches open per agent (audit log)", s["watches_open_per_agent"]),
        ("  the apiserver's watch gauge, per agent", fig["apiserver_watch_gauge_per_agent"]),
        ("TCP connections per agent to the apiserver", fig["tcp_connections_per_agent"]),
        ("agent RSS MiB", fig["agent_rss_mib"]),
        ("plugin RSS MiB", fig["plugin_rss_mib"]),
        ("agent CPU % of a core", fig["agent_cpu_pct"]),
        ("apiserver CPU % / RSS MiB", f"{fig['apiserver_cpu_pct']} / {fig['apiserver_rss_mib']}"),
        ("relists in the steady window", s["relists"]),
    ]
    r = fig.get("restart")
    if r:
        rows += [
            (
                "apiserver restart: old process stopped in / new one ready in",
                f"{r['old_apiserver_stop_s']} s / {r['new_apiserver_ready_s']} s",
            ),
            ("  watches open per agent before it", r["watches_open_before_per_agent"]),
            ("  relists after the restart", f"{r['relists']} {r['relists_by_kind']}"),
            (
                "  requests in the 60 s after it is up",
                f"{r['requests_first_60s']} ({r['requests_first_60s_per_agent']} per agent; "
                f"steady: {r['steady_requests_in_60s']}), peak {r['peak_requests_per_s']}/s",
            ),
            ("  burst by kind", r["burst_by_kind"]),
            ("  errors in that window", r["errors_first_60s"] or "none"),
            ("  writes in that window", r["writes_first_60s"]),
            ("  agents not ready at some point", r["agents_not_ready_during_restart"]),
            ("  their first reasons", r["not_ready_reasons"] or "-"),
            (
                "  every agent ready again, after the new process started",
                f"{r['all_ready_after_start_s']} s",
            ),
            (
                "  every agent's watches re-opened, after it started",
                f"{r['all_watches_back_after_start_s']} s (median {r['watches_back_p50_s']} s)",
            ),
        ]
    return "\n".join(f"| {k} | {v} |" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Load: many nodeagent processes (own node identity, Node, state dir, "
        "registry and DRA plugin each) against one audited kube-apiserver; prints the figures."
    )
    p.add_argument("--agents", type=int, default=100, help="number of agents")
    p.add_argument("--steady", type=float, default=300.0, help="seconds of the steady window")
    p.add_argument("--settle", type=float, default=30.0, help="seconds after start-up before it")
    p.add_argument("--restart", action="store_true", help="restart the apiserver afterwards")
    p.add_argument("--after-restart", type=float, default=60.0, help="seconds measured after it")
    p.add_argument("--kill", action="store_true", help="restart by SIGKILL instead of SIGTERM")
    p.add_argument("--batch", type=int, default=10, help="agents started at a time")
    p.add_argument("--devices", type=int, default=4, help="devices per plugin")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting for every agent (repeatable)",
    )
    p.add_argument("--workdir", type=pathlib.Path, default=None)
    p.add_argument("--json", type=pathlib.Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="nodeagent-load-"))
    fig = run(
        args.agents,
        args.steady,
        args.settle,
        args.restart,
        args.set,
        workdir,
        batch=args.batch,
        after_restart=args.after_restart,
        devices=args.devices,
        kill=args.kill,
    )
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2, default=str))
    print(table(fig))
    print(f"apiserver dir (audit.log): {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
