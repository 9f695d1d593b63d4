"""A standalone agent and a real SDK device plugin killed with SIGKILL (its socket file left
behind): /v1/resourceslices shows the driver's pool, not registered, for the configured
`resources.disconnect_grace`, then no more (issue 29 item 14: it stayed minutes past it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_process_resourceslices import DRIVER, NODE, PLUGIN
from tests.support.wait import NotYet, until

GRACE = 3.0
CONFIG = f"""
[plugins]
probe_interval = 0.5

[resources]
disconnect_grace = {GRACE}
"""


def driver_view(agent: AgentProcess) -> dict[str, Any] | None:
    doc: dict[str, Any] = json.loads(agent.get("/v1/resourceslices")[1])
    view: dict[str, Any] | None = doc["drivers"].get(DRIVER)
    return view


def test_a_killed_plugins_pool_goes_after_the_disconnect_grace(
    start_agent: StartAgent, registry: str
) -> None:
    plugin = subprocess.Popen([sys.executable, "-c", PLUGIN, registry], stderr=subprocess.PIPE)
    try:
        agent = start_agent("--node-name", NODE, "--registry-dir", registry, config=CONFIG)
        agent.wait_ready()

        def shown() -> dict[str, Any] | NotYet:
            view = driver_view(agent)
            return view if view and view["registered"] and view["pools"] else NotYet(view)

        assert [len(s["devices"]) for s in until(shown, "the pool")["pools"][NODE]] == [3]
        plugin.kill()
        plugin.wait(10)
        assert any(p.suffix == ".sock" for p in Path(registry).iterdir()), "socket file left"

        # The agent's word that the plugin left: the driver not registered (or, on a slow
        # machine whose poll came late, already dropped).
        def left() -> dict[str, Any] | NotYet | None:
            view = driver_view(agent)
            return view if view is None or not view["registered"] else NotYet(view)

        left_view = until(left, "the plugin deregistered")
        if left_view is not None:
            assert list(left_view["pools"]) == [NODE]  # kept while the grace runs

        def dropped() -> bool | NotYet:
            view = driver_view(agent)
            return True if view is None else NotYet(view)

        # A bound for a loaded machine, well below the default grace (30 s, which the
        # standalone publisher used whatever the configuration said) and the deregistered
        # plugin's data grace (300 s, which the view followed).
        until(dropped, "the gone driver's pool dropped", timeout=GRACE + 15)
        agent.signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0
    finally:
        if plugin.poll() is None:
            plugin.kill()
        plugin.wait(10)
        assert plugin.stderr is not None
        plugin.stderr.close()
