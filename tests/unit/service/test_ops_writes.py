"""/v1/writes and `nodeagent status`'s dry-run section, and `nodeagent run --dry-run`."""

from __future__ import annotations

import json

import trio

from nodeagent.cli import build_parser, overrides_from_args, render_writes
from nodeagent.config.loader import Override
from nodeagent.kube import CONFIGMAPS
from nodeagent.kube.dryrun import DryRun
from nodeagent.service.config import load_config
from nodeagent.service.ops import OpsServer
from nodeagent.service.settings import OpsSettings
from tests.unit.service.test_ops import FakeView, get


def _recorded() -> DryRun:
    dry = DryRun(keep=2)
    cm = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"},'
    dry.record("create", CONFIGMAPS, "ns", "", cm + b'"data":{"k":"v"}}', None)
    dry.record(
        "update", CONFIGMAPS, "ns", "a", cm + b'"data":{"k":"w"}}', cm + b'"data":{"k":"v"}}'
    )
    dry.record("delete", CONFIGMAPS, "ns", "a", None, cm + b'"data":{"k":"w"}}')
    return dry


async def _serve(nursery: trio.Nursery, dry: DryRun | None) -> OpsServer:
    ops = OpsServer(OpsSettings(address="127.0.0.1:0"), FakeView(), dry_run=dry)
    await nursery.start(ops.run)
    return ops


async def test_v1_writes_shows_the_kept_writes_and_the_counters(nursery: trio.Nursery) -> None:
    ops = await _serve(nursery, _recorded())
    status, headers, body = await get(ops, "/v1/writes")
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert (doc["dry_run"], doc["total"], doc["older"]) == (True, 3, 1)
    update, delete = doc["writes"]
    assert update["verb"] == "update"
    assert update["object"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": "ns",
        "name": "a",
    }
    assert update["diff"] == [{"op": "replace", "path": "/data/k", "value": "w"}]
    assert delete["verb"] == "delete" and {"op": "remove", "path": "/data"} in delete["diff"]


async def test_v1_writes_of_an_agent_that_writes_for_real(nursery: trio.Nursery) -> None:
    ops = await _serve(nursery, None)
    doc = json.loads((await get(ops, "/v1/writes"))[2])
    assert doc == {"dry_run": False, "total": 0, "older": 0, "repeated": 0, "writes": []}


def test_status_lists_each_would_be_write_with_the_paths_it_changes() -> None:
    text = render_writes(_recorded().view())
    assert "DRY RUN: nothing is written. 3 writes" in text and "1 older not kept" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TIME"))
    assert lines[header].split() == ["TIME", "VERB", "KIND", "OBJECT", "CHANGES"]
    update, delete = lines[header + 1 :]
    assert update.split()[1:] == ["update", "ConfigMap", "ns/a", "~/data/k"]
    assert delete.split()[1:4] == ["delete", "ConfigMap", "ns/a"]
    assert "-/data" in delete and "-/kind" in delete


def test_status_of_an_agent_that_writes_for_real_has_no_dry_run_section() -> None:
    assert render_writes(None) == ""
    assert render_writes(DryRun().view() | {"dry_run": False}) == ""
    assert "0 writes" in render_writes(DryRun().view())


def test_run_dry_run_flag_sets_the_config_field() -> None:
    args = build_parser().parse_args(["run", "--dry-run"])
    assert Override("agent.dry_run", True, "--dry-run") in overrides_from_args(args)
    config, _ = load_config("/dev/null", overrides_from_args(args))
    assert config.agent.dry_run is True
    plain = build_parser().parse_args(["run"])
    assert load_config("/dev/null", overrides_from_args(plain))[0].agent.dry_run is False
