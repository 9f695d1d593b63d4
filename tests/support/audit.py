"""kube-apiserver audit logs in tests: a harness apiserver started with one, and its events."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Iterator
from contextlib import suppress
from datetime import datetime
from typing import Any

from tests.support.apiserver import ApiServer, start_apiserver


def start_audited_apiserver(workdir: pathlib.Path, policy: str, nodes: Iterable[str]) -> ApiServer:
    """start_apiserver in workdir/srv, logging what `policy` (an audit.k8s.io/v1 Policy in
    YAML) selects as JSON lines to workdir/audit.log, written before each request completes."""
    policy_file = workdir / "audit-policy.yaml"
    policy_file.write_text(policy)
    return start_apiserver(
        workdir / "srv",
        nodes=tuple(nodes),
        extra_args=[
            f"--audit-policy-file={policy_file}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-mode=blocking",
            "--audit-log-format=json",
        ],
    )


def audit_events(apiserver: ApiServer, since: float) -> Iterator[tuple[float, dict[str, Any]]]:
    """(received, event) of each answered request (stage ResponseComplete) received at or
    after `since` (time.time() seconds), oldest first; unreadable lines are skipped."""
    path = apiserver.dir.parent / "audit.log"
    for line in path.read_bytes().splitlines() if path.exists() else ():
        with suppress(ValueError, KeyError):
            event = json.loads(line)
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if received >= since and event.get("stage") == "ResponseComplete":
                yield received, event
