"""`/healthz` while one DRA plugin with 8,192 devices re-sends the same inventory at 10 Hz (issue
29 item 13b: p99 270-331 ms, median 3 ms, where 29 ms was measured before the conversion moved to
Rust).

Real processes: a `nodeagent run` (standalone: no apiserver) and an SDK plugin
(`nodeagent.sdk.DevicePlugin`, native API, the example's devices: 4 attributes and a capacity
each) that publishes its inventory once and then sends that same message again every 100 ms.
This process polls the agent's `/healthz` at 50 Hz over HTTP and reports the latency percentiles
and how many messages the agent counted meanwhile.

- ours: the agent as it is: a stream's message whose bytes are those of the message before is
  not decoded again (the bridge hands back the same object), and the handler, seeing the message
  it published last, counts it and stops there (nothing validated, converted or published);
  readiness (every heartbeat) reads the stream's state without rendering the last message;
- baseline: the same agent as it was, patched back in the agent process: every message
  decoded anew (the codec's comparison out), so each re-send is validated, published and
  converted by the publisher, and readiness rendering the plugin's last message (8,192 devices
  as a dict: ~250 ms) at every heartbeat;
- idle: the same agent with no plugin at all: what the machine itself adds to a probe (on a
  shared 2-core machine, most of the tail).

Run: .venv/bin/python -m pytest benches/bench_resend.py --benchmark-only
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from benches.report import latencies, latency_line, print_uncaptured, ratio_line

DEVICES = 8192
RESEND_HZ = 10.0
POLL_HZ = 50.0
SECONDS = 15.0
NAME = "resend.example.com"

RESULTS: dict[str, dict[str, float]] = {}


# -- the two processes -------------------------------------------------------------------------


def _plugin(registry: str) -> None:
    from examples.dra_device_plugin import devices
    from nodeagent.sdk import DevicePlugin

    async def main() -> None:
        async with DevicePlugin.serve(name=NAME, registry_dir=registry) as plugin:
            await plugin.publish(devices(DEVICES))
            message = plugin.latest.value
            assert message is not None
            while True:
                await trio.sleep(1 / RESEND_HZ)
                await plugin.publish_message(message)  # the same inventory, sent again

    trio.run(main)


def _agent(baseline: bool, argv: list[str]) -> int:
    if baseline:
        # Every message decoded anew, as before the comparison: each re-send is a new object.
        from nodeagent.rpc import _grpc

        _grpc.StreamCodec.decode = _grpc.LimitedProtoCodec.decode  # type: ignore[method-assign]
        # And readiness renders the last message, as it did at every heartbeat.
        from nodeagent.plugins.streaming import StreamingHandler

        status = StreamingHandler.plugin_status

        def rendered(self: Any, name: str, *, message: bool = True) -> dict[str, Any] | None:
            return status(self, name)

        StreamingHandler.plugin_status = rendered  # type: ignore[method-assign]
    from nodeagent.cli import main

    return main(argv)


# -- the measurement ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _messages(ops: str) -> float:
    text = _get(f"{ops}/metrics")
    found = re.search(r'^nodeagent_plugin_messages_total\{type="DRAPlugin"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _wait(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def run(variant: str) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="nodeagent-resend-"))
    registry = work / "registry"
    registry.mkdir()
    ops = f"http://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    me = [sys.executable, "-m", "benches.bench_resend"]
    agent = subprocess.Popen(
        [
            *me,
            "agent",
            variant,
            "run",
            "--state-dir",
            str(work / "state"),
            "--registry-dir",
            str(registry),
            "--ops-address",
            ops.removeprefix("http://"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    plugin = None
    if variant != "idle":
        plugin = subprocess.Popen(
            [*me, "plugin", str(registry)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        if plugin is None:
            _wait(lambda: _get(f"{ops}/healthz") == "ok\n", "the agent answering")
        else:
            _wait(lambda: _messages(ops) >= 10, "the agent receiving the plugin's messages")
        before, start = _messages(ops), time.perf_counter()
        probes: list[float] = []  # seconds per /healthz
        end = start + SECONDS
        while (now := time.perf_counter()) < end:
            _get(f"{ops}/healthz")
            probes.append(time.perf_counter() - now)
            time.sleep(max(0.0, now + 1 / POLL_HZ - time.perf_counter()))
        received = _messages(ops) - before
        elapsed = time.perf_counter() - start
    finally:
        for proc in (plugin, agent):
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    return {**latencies(probes), "messages_per_s": received / elapsed}


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, print_results)


def print_results(write: Callable[[str], None]) -> None:
    ours, base = RESULTS.get("ours"), RESULTS.get("baseline")
    if not RESULTS:
        return
    write("")
    write(
        f"/healthz at {POLL_HZ:.0f} Hz, one plugin of {DEVICES} devices re-sending the same "
        f"inventory at {RESEND_HZ:.0f} Hz, {SECONDS:.0f} s"
    )
    for name, r in RESULTS.items():
        more = f"{r['samples']:.0f} probes, {r['messages_per_s']:.1f} messages/s counted"
        write(latency_line(name, r, more))
    if not ours or not base:
        return
    write(ratio_line(base, ours, "ours p99 of a few ms"))


@pytest.mark.parametrize("variant", ["ours", "baseline", "idle"])
def test_resend(benchmark: Any, variant: str) -> None:
    benchmark.group = "resend"
    benchmark.pedantic(lambda: RESULTS.__setitem__(variant, run(variant)), rounds=1, iterations=1)


if __name__ == "__main__":
    if sys.argv[1] == "plugin":
        _plugin(sys.argv[2])
    else:
        sys.exit(_agent(sys.argv[2] == "baseline", sys.argv[3:]))
