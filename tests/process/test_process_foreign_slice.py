"""Issue 20 item 1 with the real agent process, a real SDK plugin process (native API, pool
node-a, three GPUs) and the real kube-apiserver: a ResourceSlice without the managed-by label
(an older install of the driver) created in the plugin's pool at offsets around the plugin's
start, when it registers and its inventory is published: 3 s and 0.5 s before the plugin
process starts, at 0 s, 0.3 s after (the issue's reproductions: 0.5 s before and 0.3 s after
left two slices each claiming `resourceSliceCount: 1`, the component ready), the moment the
plugin's socket appears in the registry (polled every 5 ms), the moment the agent shows the plugin
registered (polled every 10 ms), and in a pool published for a while.
`test_resourceslices_foreign_race.py` places it exactly inside nodeagent's create. Each case
prints its offsets from the plugin's start and from its registration (as /v1/resourceslices
first showed it, polled every 10 ms) and whether nodeagent had created a slice.

Whatever the offset: the foreign slice ends alone in the pool (nodeagent deletes its own, or
never creates one), /readyz reports the resources component not ready with the refusal,
/v1/resourceslices lists the pool as failing, and nodeagent publishes the pool once the foreign
slice is deleted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import RESOURCESLICES
from tests.integration.conftest import client_for
from tests.process.conftest import StartAgent
from tests.process.test_process_resourceslices import (
    DRIVER,
    NODE,
    PLUGIN,
    metric_sum,
    node,
    node_slices,
    start_cluster_agent,
)
from tests.support.apiserver import ApiServer
from tests.support.wait import until

__all__ = ["node"]  # fixture, re-used

LABEL = "app.kubernetes.io/managed-by"


def foreign_body() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "older-install-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "theirs"}],
        },
    }


def admin_call(apiserver: ApiServer, verb: str, name: str = "") -> str:
    async def call() -> str:
        async with client_for(apiserver, "admin") as client:
            if verb == "create":
                answer = await client.create(RESOURCESLICES, foreign_body())
                return str(msgspec.json.decode(answer)["metadata"]["name"])
            await client.delete(RESOURCESLICES, name)
            return name

    return trio.run(call)


class PluginProcess:
    def __init__(self, registry: str) -> None:
        self.registry = registry
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> float:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PLUGIN, self.registry], stderr=subprocess.PIPE, text=True
        )
        return time.monotonic()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def plugin(registry: str) -> Iterator[PluginProcess]:
    p = PluginProcess(registry)
    yield p
    p.stop()


def names(apiserver: ApiServer) -> list[str]:
    return [o["metadata"]["name"] for o in node_slices(apiserver)]


def registered(agent: Any) -> bool:
    doc = json.loads(agent.get("/v1/resourceslices")[1])
    return bool(doc["drivers"].get(DRIVER, {}).get("registered"))


class RegistrationClock:
    """When the agent first shows the plugin registered (a thread polling every 10 ms)."""

    def __init__(self, agent: Any) -> None:
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(agent,), daemon=True)
        self._thread.start()

    def _poll(self, agent: Any) -> None:
        while not self._stop.is_set() and self.at is None:
            with suppress(OSError):
                if registered(agent):
                    self.at = time.monotonic()
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


# (case, seconds from the foreign slice's creation to the plugin's start, or None: once the
# pool is published)
CASES = [("3s-before", 3.0), ("0.5s-before", 0.5), ("0s", 0.0), ("0.3s-after", -0.3)]


# The moment the plugin's socket appears (the agent registers it next), the moment the agent
# shows it registered, once the pool is published.
LATER = [("socket", None), ("registered", None), ("published", None)]


@pytest.mark.parametrize(("case", "lead"), [*CASES, *LATER], ids=[c for c, _ in [*CASES, *LATER]])
def test_a_foreign_slice_around_a_plugins_registration(
    apiserver: ApiServer,
    node: None,
    start_agent: StartAgent,
    registry: str,
    plugin: PluginProcess,
    case: str,
    lead: float | None,
) -> None:
    agent = start_cluster_agent(start_agent, apiserver, registry)
    registration = RegistrationClock(agent)
    if case == "socket":
        started = plugin.start()
        deadline = time.monotonic() + 30
        while not any(Path(registry).glob("*.sock")):
            assert time.monotonic() < deadline, "the plugin never made its socket"
            time.sleep(0.005)
        foreign_at = time.monotonic()
        foreign = admin_call(apiserver, "create")
    elif case == "registered":
        started = plugin.start()
        deadline = time.monotonic() + 30
        while not registered(agent):
            assert time.monotonic() < deadline, "the plugin never registered"
            time.sleep(0.01)
        foreign_at = time.monotonic()
        foreign = admin_call(apiserver, "create")
    elif lead is None:
        started = plugin.start()
        until(lambda: len(names(apiserver)) == 1, "the plugin's pool published")
        foreign_at = time.monotonic()
        foreign = admin_call(apiserver, "create")
    elif lead >= 0:
        foreign_at = time.monotonic()
        foreign = admin_call(apiserver, "create")
        time.sleep(lead)  # the offset under test, against a real process: no event to wait for
        started = plugin.start()
    else:
        started = plugin.start()
        time.sleep(-lead)
        foreign_at = time.monotonic()
        foreign = admin_call(apiserver, "create")

    def refused() -> str | None:
        if names(apiserver) != [foreign]:
            return None
        code, body = agent.get("/readyz?verbose")
        return body if code == 503 and f"not managed by nodeagent ({foreign})" in body else None

    try:
        ready = until(refused, "the pool refused with the foreign slice alone in it")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {names(apiserver)}, {agent.get('/readyz?verbose')}") from None
    assert "[-]resources not ready: pool node-a of driver gpu.example.com" in ready, ready
    doc = json.loads(agent.get("/v1/resourceslices")[1])
    ((failing),) = doc["sync"]["failing_pools"]
    assert (failing["driver"], failing["pool"]) == (DRIVER, NODE)
    creates = metric_sum(agent, "nodeagent_resourceslice_writes_total", 'verb="create"')
    # Refused stays refused: nothing of nodeagent's comes back beside the foreign slice.
    time.sleep(1.5)
    assert names(apiserver) == [foreign]
    assert metric_sum(agent, "nodeagent_resourceslice_writes_total", 'verb="create"') == creates
    if case == "3s-before":
        assert creates == 0, "refused before any write"

    admin_call(apiserver, "delete", foreign)

    def published() -> list[dict[str, Any]] | None:
        items = node_slices(apiserver)
        if len(items) != 1 or items[0]["metadata"]["labels"].get(LABEL) != "nodeagent":
            return None
        return items if agent.get("/readyz")[0] == 200 else None

    try:
        (ours,) = until(published, "the pool published again, the agent ready")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {names(apiserver)}, {agent.get('/readyz?verbose')}") from None
    assert ours["spec"]["pool"]["resourceSliceCount"] == 1
    assert [d["name"] for d in ours["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    registration.close()
    assert registration.at is not None
    # The timings the closing note quotes (pytest -s).
    print(
        f"\n{case}: foreign created {foreign_at - started:+.3f} s from the plugin's start, "
        f"{foreign_at - registration.at:+.3f} s from its registration; nodeagent slices "
        f"created before the refusal: {int(creates)}"
    )
    plugin.stop()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
