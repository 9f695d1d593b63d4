"""Issue 29 item 1 over real unix sockets: a registry socket nobody listens on (its plugin killed
by OOM or SIGKILL left it) is a plugin that left, not one unreachable. It is shown `stale` with
its path and the fix, counted by a gauge, never held against readiness (even with a bound far
shorter than its retries), and left on disk; a plugin binding the path again registers."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginManager
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import ReporterPlugin
from tests.plugins.conftest import fast_settings
from tests.plugins.support import WAIT, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FIX = "remove it or restart the plugin"


def socket_status(manager: PluginManager, path: str) -> dict[str, Any]:
    for item in manager.status():
        if item["socket"] == path:
            return item
    return {}


def stale_gauge() -> float | None:
    return REGISTRY.get_sample_value("nodeagent_plugin_stale_sockets")


def assert_ready_naming(manager: PluginManager, path: str) -> None:
    ready, why = manager.readiness()
    assert ready, why
    assert "unreachable" not in why, why
    assert "1 stale sockets refuse connections (nobody listening: remove them or restart " in why
    assert why.endswith(path), why


async def test_a_socket_nobody_listens_on_is_stale_not_unreachable(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    path = os.path.join(registry, "gone.sock")
    # What a plugin killed before it could clean up leaves: a socket file, nobody listening.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.listen()
    dead.close()
    # A bound far shorter than the registration retries: "unreachable" would be not ready.
    manager = PluginManager(fast_settings(registry, unreachable_bound=0.05), bridge)
    await nursery.start(manager.run)
    await wait_until(manager, lambda: socket_status(manager, path).get("state") == "stale")
    item = socket_status(manager, path)
    assert path in item["last_error"] and "refuses connections" in item["last_error"]
    assert item["last_error"].endswith(FIX)
    assert_ready_naming(manager, path)
    assert stale_gauge() == 1.0
    # Retried with backoff (a socket bound but not listening yet refuses too), still stale.
    record = manager._caches.records[path]
    await wait_until(manager, lambda: record.registration_failures >= 4)
    assert socket_status(manager, path)["state"] == "stale"
    assert_ready_naming(manager, path)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)  # not the agent's file: never deleted
    # The plugin comes back: binding the path makes a new socket file, a new generation.
    async with ReporterPlugin.serve(name="gone", registry_dir=registry, bridge=bridge):
        await wait_until(manager, lambda: socket_status(manager, path).get("state") == "registered")
        assert manager.readiness() == (True, "1 plugins registered, 0 not registered")
        await wait_until(manager, lambda: stale_gauge() == 0.0)  # at the registration's end


async def test_a_killed_plugin_is_deregistered_and_its_socket_reported_stale(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry, unreachable_bound=30.0), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    path = os.path.join(registry, "cpu-reporter.sock")

    async def start_plugin() -> trio.Process:
        return await trio.lowlevel.open_process(
            [sys.executable, str(EXAMPLES / "cpu_reporter.py"), "--registry-dir", registry],
            stderr=subprocess.DEVNULL,
        )

    process = await start_plugin()
    try:
        await wait_until(
            manager,
            lambda: socket_status(manager, path).get("state") == "registered",
            within=WAIT * 2,
        )
        await wait_until(manager, lambda: "cpu-reporter" in channel.value, within=WAIT * 2)
        process.send_signal(signal.SIGKILL)  # an OOM kill: no cleanup, the socket stays
        with trio.fail_after(WAIT):
            await process.wait()
        # Deregistered after the probe failures, as the kubelet's monitor does.
        await wait_until(manager, lambda: socket_status(manager, path).get("state") == "stale")
        await wait_until(manager, lambda: not channel.value["cpu-reporter"].registered)
        item = socket_status(manager, path)
        assert item["last_error"].startswith("deregistered after 2 failed probes: socket " + path)
        assert item["last_error"].endswith(FIX)
        assert_ready_naming(manager, path)
        assert stale_gauge() == 1.0
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        # Restarted: it replaces its stale socket and registers again.
        process = await start_plugin()
        await wait_until(
            manager,
            lambda: socket_status(manager, path).get("state") == "registered",
            within=WAIT * 2,
        )
        await wait_until(manager, lambda: channel.value["cpu-reporter"].registered)
        assert manager.readiness() == (True, "1 plugins registered, 0 not registered")
        await wait_until(manager, lambda: stale_gauge() == 0.0)  # at the registration's end
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
