"""The report store's lifecycle (replace, grace, carry-over, checkpoint, restore) on a fake
plugin channel, with Trio's autojump clock and a real checkpoint directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.reporter.model import PluginReport
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.reporter.store import (
    CHECKPOINT_NAME,
    ReportStore,
    decode_checkpoint,
    encode_checkpoint,
)

T = TypeVar("T")

GRACE = 300.0
WALL = 1_700_000_000.0


def response(value: int) -> rep.GetReportContentResponse:
    gvk = {"group": "node.katalyst.kubewharf.io", "version": "v1alpha1", "kind": "CNR"}
    field = rep.ReportField(fieldType=rep.Status, fieldName="value", value=str(value).encode())
    return rep.GetReportContentResponse(
        content=[rep.ReportContent(groupVersionKind=gvk, field=[field])]
    )


def value_of(report: PluginReport) -> int:
    return int(report.response.content[0].field[0].value)


class Channel:
    """The plugin manager's ReporterPlugin channel, driven by the test."""

    def __init__(self) -> None:
        self.latest: LatestValue[Mapping[str, PluginData]] = LatestValue(MappingProxyType({}))
        self.data: dict[str, PluginData] = {}

    def send(self, name: str, value: int, *, registered: bool = True, live: bool = True) -> None:
        self.data[name] = PluginData(
            name, "ReporterPlugin", f"/p/{name}.sock", response(value), 0.0, registered, live
        )
        self.latest.set(MappingProxyType(dict(self.data)))

    def mark(self, name: str, *, registered: bool = True, live: bool = True) -> None:
        old = self.data[name]
        self.data[name] = PluginData(
            name, old.plugin_type, old.endpoint, old.message, old.received_at, registered, live
        )
        self.latest.set(MappingProxyType(dict(self.data)))

    def forget(self, name: str) -> None:
        del self.data[name]
        self.latest.set(MappingProxyType(dict(self.data)))


class Clock:
    def __init__(self) -> None:
        self.now = WALL

    def __call__(self) -> float:
        return self.now


class SystemStub:
    """An in-tree reporter whose answers the test sets."""

    name = "system-reporter-plugin"

    def __init__(self) -> None:
        self.value = 1
        self.fail = False
        self.calls = 0

    def collect(self) -> rep.GetReportContentResponse:
        self.calls += 1
        if self.fail:
            raise OSError("cannot read /sys")
        return response(self.value)


async def inline(fn: Callable[..., T], *args: Any) -> T:
    """Blocking work in the test's thread: the mock clock must not jump while it runs."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


@asynccontextmanager
async def running(
    channel: Channel,
    checkpoints: CheckpointStore | None = None,
    clock: Clock | None = None,
    **settings: object,
) -> AsyncIterator[ReportStore]:
    values: dict[str, object] = {"grace": GRACE, "sync_interval": 5.0}
    values.update(settings)
    in_tree = values.pop("in_tree", ())
    config = ReporterSettings(**values)  # type: ignore[arg-type]
    config.validate()
    store = ReportStore(
        channel.latest,
        LatestValue(config),
        checkpoints,
        in_tree=in_tree,  # type: ignore[arg-type]
        clock=clock or Clock(),
        run_sync=inline,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        yield store
        nursery.cancel_scope.cancel()


def moved_aside(directory: Path) -> list[Path]:
    return list(directory.glob(f"{CHECKPOINT_NAME}.corrupt-*"))


async def settle() -> None:
    """Let every task run to its next wait (the store is woken by channel versions)."""
    await trio.testing.wait_all_tasks_blocked()


async def test_every_message_replaces_the_plugins_report(
    autojump_clock: trio.testing.MockClock,
) -> None:
    channel = Channel()
    async with running(channel) as store:
        channel.send("a", 1)
        await settle()
        report = store.latest.value["a"]
        assert (report.plugin, value_of(report), report.running, report.stopped_at) == (
            "a",
            1,
            True,
            None,
        )
        channel.send("a", 2)
        channel.send("b", 7)
        await settle()
        assert {n: value_of(r) for n, r in store.latest.value.items()} == {"a": 2, "b": 7}
        # The same report again (a poll answering what was streamed) changes nothing.
        version = store.latest.version
        channel.send("a", 2)
        await settle()
        assert store.latest.version == version


@pytest.mark.parametrize("how", ["deregistered", "not live", "forgotten"])
async def test_a_stopped_plugin_keeps_its_report_for_the_grace_then_it_is_dropped(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    channel, clock = Channel(), Clock()
    expired = REGISTRY.get_sample_value("nodeagent_reporter_reports_expired_total") or 0.0
    async with running(channel, clock=clock) as store:
        channel.send("a", 1)
        channel.send("b", 2)
        await settle()
        clock.now = WALL + 10
        if how == "deregistered":
            channel.mark("a", registered=False, live=False)
        elif how == "not live":
            channel.mark("a", live=False)  # the stream ended and the polls fail
        else:
            channel.forget("a")  # the plugin layer dropped it first (a shorter grace there)
        await settle()
        report = store.latest.value["a"]
        assert (value_of(report), report.running, report.stopped_at) == (1, False, WALL + 10)
        await trio.sleep(GRACE - 1)
        assert "a" in store.latest.value
        await trio.sleep(2)
        assert "a" not in store.latest.value
        assert store.latest.value["b"].running
    after = REGISTRY.get_sample_value("nodeagent_reporter_reports_expired_total")
    assert after == expired + 1


async def test_re_registration_within_the_grace_carries_the_report_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    channel = Channel()
    async with running(channel) as store:
        channel.send("a", 1)
        await settle()
        channel.mark("a", registered=False, live=False)
        await settle()
        await trio.sleep(GRACE - 10)
        # Registered again: the plugin layer republishes the kept message as live.
        channel.mark("a")
        await settle()
        report = store.latest.value["a"]
        assert (value_of(report), report.running, report.stopped_at) == (1, True, None)
        await trio.sleep(GRACE)  # the old grace no longer applies
        assert store.latest.value["a"].running
        channel.send("a", 3)
        await settle()
        assert value_of(store.latest.value["a"]) == 3


async def test_every_change_is_checkpointed_and_a_restart_restores_stopped_entries(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    channel = Channel()
    async with running(channel, checkpoints) as store:
        channel.send("a", 1)
        channel.send("b", 2)
        await settle()
        await store.checkpoint_synced()
        assert store.checkpoint_writes >= 1
        read = checkpoints.read(CHECKPOINT_NAME)
        assert read.state is CheckpointState.FOUND and read.data is not None
        assert {
            n: int(r.content[0].field[0].value)
            for n, (r, _) in decode_checkpoint(read.data).items()
        } == {
            "a": 1,
            "b": 2,
        }
    # The agent restarts; no plugin has registered yet.
    clock = Clock()
    clock.now = WALL + 1000
    fresh = Channel()
    async with running(fresh, checkpoints, clock) as store:
        restored = store.latest.value
        assert {n: (value_of(r), r.running, r.stopped_at) for n, r in restored.items()} == {
            "a": (1, False, WALL + 1000),
            "b": (2, False, WALL + 1000),
        }
        # "a" comes back (its first message is the same report); "b" never does.
        await trio.sleep(GRACE / 2)
        fresh.send("a", 1)
        await settle()
        assert store.latest.value["a"].running
        await trio.sleep(GRACE / 2 + 1)
        assert set(store.latest.value) == {"a"}
        await store.checkpoint_synced()
        read = checkpoints.read(CHECKPOINT_NAME)
        assert read.data is not None
        assert set(decode_checkpoint(read.data)) == {"a"}


async def test_a_plugin_already_stopped_when_checkpointed_keeps_only_the_rest_of_its_grace(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    channel, clock = Channel(), Clock()
    async with running(channel, checkpoints, clock) as store:
        channel.send("a", 1)
        await settle()
        channel.mark("a", registered=False, live=False)
        await settle()
        assert store.latest.value["a"].stopped_at == WALL
        await store.checkpoint_synced()
    clock.now = WALL + GRACE - 60  # the agent was down for most of the grace
    async with running(Channel(), checkpoints, clock) as store:
        assert store.latest.value["a"].stopped_at == WALL
        await trio.sleep(59)
        assert "a" in store.latest.value
        await trio.sleep(2)
        assert "a" not in store.latest.value


async def test_a_corrupt_checkpoint_is_a_fresh_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    (tmp_path / CHECKPOINT_NAME).write_bytes(b'{"Data":{},"Checksum":1}')  # Katalyst's format
    channel = Channel()
    async with running(channel, checkpoints) as store:
        assert dict(store.latest.value) == {}
        assert moved_aside(tmp_path)
        channel.send("a", 1)
        await settle()
        await store.checkpoint_synced()
    read = checkpoints.read(CHECKPOINT_NAME)
    assert read.data is not None and set(decode_checkpoint(read.data)) == {"a"}


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b'{"version":2,"plugins":{}}',
        b'{"version":1,"plugins":{"a":{"response":"!!"}}}',
    ],
)
async def test_a_checkpoint_whose_content_does_not_parse_is_a_fresh_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, payload: bytes
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    checkpoints.write(CHECKPOINT_NAME, payload)
    before = REGISTRY.get_sample_value("nodeagent_reporter_checkpoint_invalid_total") or 0.0
    async with running(Channel(), checkpoints) as store:
        assert dict(store.latest.value) == {}
    assert REGISTRY.get_sample_value("nodeagent_reporter_checkpoint_invalid_total") == before + 1


async def test_in_tree_reporters_are_collected_kept_on_failure_and_checkpointed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    system = SystemStub()
    name = system.name
    errors = REGISTRY.get_sample_value("nodeagent_reporter_in_tree_errors_total", {"plugin": name})
    async with running(Channel(), checkpoints, in_tree=[system], sync_interval=5.0) as store:
        # Collected before started(): the first published mapping has it.
        assert value_of(store.latest.value[name]) == 1 and store.latest.value[name].running
        system.value = 2
        await trio.sleep(5.5)
        assert value_of(store.latest.value[name]) == 2
        system.fail = True
        await trio.sleep(5)
        report = store.latest.value[name]
        assert value_of(report) == 2 and report.running
        after = REGISTRY.get_sample_value(
            "nodeagent_reporter_in_tree_errors_total", {"plugin": name}
        )
        assert after == (errors or 0.0) + 1
        await store.checkpoint_synced()
    # Restored like any plugin: stopped with its report until the reporter collects again (here
    # it is disabled, so the grace runs out).
    async with running(Channel(), checkpoints) as store:
        assert not store.latest.value[name].running
        assert value_of(store.latest.value[name]) == 2
        await trio.sleep(GRACE + 1)
        assert name not in store.latest.value


async def test_checkpoint_writes_are_coalesced(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    channel = Channel()
    async with running(channel, CheckpointStore(tmp_path)) as store:
        for value in range(100):
            channel.send("a", value)
            await trio.lowlevel.checkpoint()
        await settle()
        await store.checkpoint_synced()
        assert value_of(store.latest.value["a"]) == 99
        assert 1 <= store.checkpoint_writes < 100
        read = CheckpointStore(tmp_path).read(CHECKPOINT_NAME)
        assert read.data is not None
        ((restored, _),) = decode_checkpoint(read.data).values()
        assert int(restored.content[0].field[0].value) == 99


def test_checkpoint_payload_round_trips() -> None:
    from nodeagent.reporter.store import _Entry

    entries = {
        "a": _Entry(response(1), running=True, stopped_at=None),
        "b": _Entry(response(2), running=False, stopped_at=WALL),
    }
    data = encode_checkpoint(entries, WALL + 1)
    assert json.loads(data)["version"] == 1
    decoded = decode_checkpoint(data)
    assert decoded == {"a": (response(1), None), "b": (response(2), WALL)}
