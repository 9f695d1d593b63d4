"""The dynamic-config component's Events go through the process's recorder when it has one
(attached and run by the agent, once), else through one of its own over its client."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.kube.events import EventRecorder
from nodeagent.service.dynconfig import DynconfigComponent, EventBuffer
from tests.support.fake_dynconfig import FakeHub, build, hasher
from tests.support.fake_watch import FakeClient


def component(tmp_path: Path, events: EventBuffer) -> DynconfigComponent:
    settings, store = DynconfigSettings(), CheckpointStore(tmp_path / "checkpoints")
    booted = boot(settings, store, build)
    controller = Controller(settings, store, build, hasher, FakeHub(booted.config), booted)
    return DynconfigComponent(
        node_name="node-a",
        controller=controller,
        events=events,
        client=cast(Any, FakeClient()),
        accumulator_settings=AccumulatorSettings(),
        reports=lambda: [],
    )


def test_the_process_recorder_is_left_to_the_process(tmp_path: Path) -> None:
    # Not attached yet: the agent attaches it after building the components.
    recorder = EventRecorder("node-a")
    component(tmp_path, EventBuffer(recorder))
    assert not recorder.attached


def test_without_one_the_component_posts_through_its_own(tmp_path: Path) -> None:
    events = EventBuffer()
    component(tmp_path, events)
    assert events.owned and events.recorder.attached
    assert events.recorder.node_name == "node-a"
