"""The load tooling in CI: a fleet of 3 agents (own node identities, Nodes, state dirs,
registries and DRA plugin processes) against one audited apiserver for a few seconds, with a
crash-restart of the apiserver, checking that the accounting works: the audit log's request
count per agent matches what each agent counted itself, the watches it says are open match the
apiserver's gauge and the agents' TCP connections, the relists it finds after the restart match
the agents' own list counter, and every agent re-opened its watches. The full measurement is
`python -m tests.load.agents --agents 100 --restart` (docs/testing/load.md; the figures:
docs/performance/index.md)."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.load.agents import restart_figures, run, steady_figures
from tests.load.fleet import Request, read_audit

pytestmark = pytest.mark.integration

AGENTS = 3


def test_a_small_fleet_is_accounted_for(tmp_path: pathlib.Path) -> None:
    fig = run(
        AGENTS,
        steady=8,
        settle=1,
        restart=True,
        settings=[],
        workdir=tmp_path,
        after_restart=0,
        kill=True,
    )
    steady = fig["steady"]
    # Every agent's requests are in the audit log, as many as it counted itself (± in flight).
    for node, (counted, audited) in fig["accounting"].items():
        assert counted > 0 and abs(counted - audited) <= 2, (node, counted, audited)
    # Watches: the audit log's open ones, the apiserver's gauge and the sockets agree (HTTP/1.1:
    # a connection per watch, plus the pooled ones for other requests).
    watches = steady["watches_open_per_agent"]
    assert watches["min"] == watches["max"] >= 4
    assert fig["apiserver_watch_gauge_per_agent"] == watches["mean"]
    assert fig["tcp_connections_per_agent"]["min"] >= watches["min"]
    assert steady["relists"] == 0
    assert fig["agent_rss_mib"]["min"] > 20 and fig["plugin_rss_mib"]["min"] > 10
    restart = fig["restart"]
    assert restart["agents_with_watches_back"] == AGENTS, fig
    assert restart["all_watches_back_after_start_s"] is not None
    # The full lists the audit log saw after the restart are the ones the agents made.
    assert restart["relists"] == fig["agents_counted_after_steady"]["lists"]
    assert restart["requests_first_60s"] > 0


def _audit_line(
    audit_id: str, stage: str, user: str, verb: str, uri: str, t0: str, t1: str, code: int = 200
) -> str:
    resource = uri.split("?")[0].rsplit("/", 1)[-1]
    return json.dumps(
        {
            "auditID": audit_id,
            "stage": stage,
            "verb": verb,
            "requestURI": uri,
            "user": {"username": user},
            "objectRef": {"resource": resource},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": f"2026-01-01T00:00:{t0}Z",
            "stageTimestamp": f"2026-01-01T00:00:{t1}Z",
        }
    )


def test_audit_records_of_a_watch_are_merged_and_others_ignored(tmp_path: pathlib.Path) -> None:
    node = "system:node:load-000"
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                _audit_line(
                    "w1", "ResponseStarted", node, "watch", "/api/v1/nodes?watch=true", "01", "01"
                ),
                _audit_line(
                    "w1", "ResponseComplete", node, "watch", "/api/v1/nodes?watch=true", "01", "09"
                ),
                _audit_line(
                    "w2", "ResponseStarted", node, "watch", "/api/v1/nodes?watch=true", "10", "10"
                ),
                _audit_line(
                    "g1", "ResponseComplete", node, "get", "/api/v1/nodes/load-000", "02", "02"
                ),
                _audit_line("a1", "ResponseComplete", "admin", "get", "/api/v1/nodes", "03", "03"),
                '{"cut by a kill',
            ]
        )
    )
    reqs = read_audit(log)
    assert [(r.verb, r.user, r.completed is None) for r in reqs] == [
        ("watch", "load-000", False),
        ("get", "load-000", False),
        ("watch", "load-000", True),
    ]
    assert reqs[0].completed is not None and reqs[0].completed - reqs[0].received == 8


def _req(user: str, verb: str, uri: str, t: float, end: float | None, code: int = 200) -> Request:
    return Request(user, verb, uri.split("?")[0].rsplit("/", 1)[-1], uri, code, t, end)


class _NoReadiness:
    last_not_ready: dict[str, float] = {}
    ever_not_ready: set[str] = set()


def test_restart_figures_count_relists_burst_and_recovery() -> None:
    nodes = "/api/v1/nodes?watch=true&fieldSelector=metadata.name%3Da"
    slices = "/apis/resource.k8s.io/v1/resourceslices?watch=true&fieldSelector=spec.nodeName%3Da"
    reqs = [
        _req("a", "watch", nodes, 0, None),  # open when the server was killed
        _req("a", "watch", slices, 0, None),
        _req("a", "get", "/version", 50, 50),  # steady window 0..60
        # after the restart at 100 (new process at 101): a resume answered 410 at once, a
        # streaming list that stays open, a 403 then a resumed watch
        _req("a", "watch", nodes, 102, 102.01),
        _req("a", "watch", nodes + "&sendInitialEvents=true", 103, 200),
        _req("a", "watch", slices, 102, 102, code=403),
        _req("a", "list", "/apis/resource.k8s.io/v1/resourceslices", 104, 104),
        _req("a", "watch", slices, 105, 200),
    ]
    steady = steady_figures(reqs, 1, 0, 60)
    assert steady["requests_per_agent_per_min"] == 3.0  # two watches and a get
    assert steady["watches_open_per_agent"]["mean"] == 2
    fig = restart_figures(reqs, ["a"], 100, 101, 104, 200, 1 / 60, _NoReadiness())  # type: ignore[arg-type]
    assert fig["relists"] == 2  # the streaming list and the LIST
    assert fig["requests_first_60s"] == 5 and fig["errors_first_60s"] == {"403": 1}
    assert fig["watches_open_before_per_agent"] == 2
    assert fig["all_watches_back_after_start_s"] == 4  # the slices watch at 105
    assert fig["writes_first_60s"] == 0
