"""Fixtures for end-to-end plugin tests: a real bridge, registry directory and manager."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from nodeagent.plugins import PluginManager, PluginSettings
from nodeagent.rpc import GrpcBridge, open_grpc_bridge


@pytest.fixture
async def bridge() -> AsyncIterator[GrpcBridge]:
    async with open_grpc_bridge() as opened:
        yield opened


def fast_settings(registry: str, **overrides: object) -> PluginSettings:
    values: dict[str, object] = {
        "registry_dir": registry,
        "scan_interval": 0.02,
        "probe_interval": 0.2,
        "probe_failures": 2,
        "probe_get_info_timeout": 0.5,
        "probe_dial_timeout": 1.0,
        "get_info_timeout": 0.5,
        "notify_timeout": 1.0,
        "dial_timeout": 1.0,
        "registration_backoff_initial": 0.05,
        "registration_backoff_max": 0.4,
        "stream_backoff_initial": 0.05,
        "stream_backoff_max": 0.2,
    }
    values.update(overrides)
    settings = PluginSettings(**values)  # type: ignore[arg-type]
    settings.validate()
    return settings


@pytest.fixture
async def manager(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> AsyncIterator[PluginManager]:
    started = PluginManager(fast_settings(registry), bridge)
    await nursery.start(started.run)
    yield started
