"""Start-up and idle footprint of `nodeagent run` (standalone), against a bare Python process.

- time from process start to READY=1 on the notify socket: the agent vs. a bare interpreter that
  sends READY=1 right away (the floor any Python service pays);
- resident memory (VmRSS) when idle with 0 plugins and with 100 reporter plugins (served by one
  helper process with the SDK), vs. the bare interpreter.

The CPU time each process used up to READY=1 is printed too: on a loaded machine the wall time
mostly measures the wait for a core.

Run: .venv/bin/python -m pytest benches/bench_startup.py --benchmark-only -s
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROUNDS = 5
PLUGINS = 100

BARE = """
import os, socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"READY=1\\nSTATUS=bare; ops on -", os.environ["NOTIFY_SOCKET"])
time.sleep(3600)
"""

# One process, one bridge, PLUGINS reporter plugins, each reporting one small field.
HELPER = """
import sys, contextlib, trio
from nodeagent.rpc.bridge import open_grpc_bridge
from nodeagent.sdk import ReporterPlugin, ReportItem

async def main(registry_dir, count):
    async with open_grpc_bridge() as bridge, contextlib.AsyncExitStack() as stack:
        for i in range(count):
            plugin = await stack.enter_async_context(
                ReporterPlugin.serve(name=f"bench-{i}", registry_dir=registry_dir, bridge=bridge)
            )
            await plugin.report([ReportItem(group="node.katalyst.kubewharf.io", version="v1alpha1",
                                      kind="CustomNodeResource", field_type="Status",
                                      field_name="resources", value={"cpu": i})])
        print("serving", flush=True)
        await trio.sleep_forever()

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""

RESULTS: dict[str, float] = {}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Started:
    def __init__(
        self, proc: subprocess.Popen[bytes], ops: str, notify: socket.socket, cpu: float = 0.0
    ) -> None:
        self.proc, self.ops, self.notify = proc, ops, notify
        self.cpu = cpu  # CPU seconds used up to READY=1: what machine load does not inflate

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()


def start(command: list[str], workdir: Path) -> tuple[Started, float]:
    """Start `command` and return it with the seconds it took to send READY=1."""
    path = workdir / f"notify-{time.monotonic_ns()}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(path))
    notify.settimeout(60)
    env = {**os.environ, "NOTIFY_SOCKET": str(path)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    while True:
        fields = dict(
            line.split("=", 1) for line in notify.recv(4096).decode().split("\n") if "=" in line
        )
        if fields.get("READY") == "1":
            elapsed = time.perf_counter() - t0
            ops = fields["STATUS"].rsplit("ops on ", 1)[-1]
            return Started(proc, ops, notify, cpu_seconds(proc.pid)), elapsed


def agent_command(workdir: Path, registry: Path | None = None) -> list[str]:
    state = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "nodeagent", "run", "--state-dir", str(state)]
    command += ["--ops-address", "127.0.0.1:0", "--log-level", "warning"]
    if registry is not None:
        command += ["--registry-dir", str(registry)]
    return command


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="na-bench-") as d:
        yield Path(d)


def measure_ready(command: list[str], benchmark: Any) -> tuple[float, float]:
    """Medians of the wall time and of the CPU time from process start to READY=1."""
    times: list[float] = []
    cpu: list[float] = []

    def once() -> None:
        proc, elapsed = start(command, Path(tempfile.gettempdir()))
        times.append(elapsed)
        cpu.append(proc.cpu)
        proc.stop()

    benchmark.pedantic(once, rounds=ROUNDS, iterations=1)
    return sorted(times)[len(times) // 2], sorted(cpu)[len(cpu) // 2]


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print("\n" + text)


@pytest.mark.benchmark(group="startup (timed: start, READY=1, stop; printed: start -> READY=1)")
def test_ready_bare_python(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    RESULTS["bare_ready"], RESULTS["bare_cpu"] = measure_ready(
        [sys.executable, "-c", BARE], benchmark
    )
    report(
        capsys,
        f"bare python -> READY=1: median {RESULTS['bare_ready'] * 1000:.0f} ms "
        f"(CPU {RESULTS['bare_cpu'] * 1000:.0f} ms)",
    )


@pytest.mark.benchmark(group="startup (timed: start, READY=1, stop; printed: start -> READY=1)")
def test_ready_nodeagent_standalone(
    benchmark: Any, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    median, cpu = measure_ready(agent_command(workdir), benchmark)
    text = (
        f"nodeagent run (standalone) -> READY=1: median {median * 1000:.0f} ms "
        f"(CPU {cpu * 1000:.0f} ms)"
    )
    bare = RESULTS.get("bare_ready")
    if bare:
        text += f"; {median / bare:.1f}x a bare interpreter ({bare * 1000:.0f} ms)"
        benchmark.extra_info["ratio_vs_bare"] = round(median / bare, 2)
    benchmark.extra_info["cpu_ms_to_ready"] = round(cpu * 1000)
    text += "; load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    report(capsys, text)


def wait_registered(ops: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{ops}/v1/plugins", timeout=10) as response:
            plugins = json.loads(response.read())
        if sum(p["state"] == "registered" and p["messages_received"] > 0 for p in plugins) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{count} plugins did not register within {timeout}s")


def settle() -> None:
    # Idle means idle: let start-up garbage be collected and the first scans finish.
    time.sleep(2.0)


@pytest.mark.benchmark(group="idle resident memory (measured once, timing = time to idle)")
def test_idle_rss(benchmark: Any, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    figures: dict[str, int] = {}

    def measure() -> None:
        bare, _ = start([sys.executable, "-c", BARE], workdir)
        agent, _ = start(agent_command(workdir), workdir)
        try:
            settle()
            figures["bare"] = rss_kib(bare.proc.pid)
            figures["agent_0"] = rss_kib(agent.proc.pid)
        finally:
            bare.stop()
            agent.stop()

        registry = workdir / "registry"
        registry.mkdir(exist_ok=True)
        agent, _ = start(agent_command(workdir, registry), workdir)
        helper = subprocess.Popen(
            [sys.executable, "-c", HELPER, str(registry), str(PLUGINS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_registered(agent.ops, PLUGINS)
            settle()
            figures["agent_100"] = rss_kib(agent.proc.pid)
            figures["helper_100"] = rss_kib(helper.pid)
        finally:
            helper.terminate()
            helper.wait(10)
            agent.stop()

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update({f"rss_kib_{k}": v for k, v in figures.items()})
    mib = {k: v / 1024 for k, v in figures.items()}
    per_plugin = (figures["agent_100"] - figures["agent_0"]) / PLUGINS
    report(
        capsys,
        f"idle RSS: bare python {mib['bare']:.1f} MiB | nodeagent 0 plugins "
        f"{mib['agent_0']:.1f} MiB ({figures['agent_0'] / figures['bare']:.1f}x bare) | "
        f"nodeagent {PLUGINS} plugins {mib['agent_100']:.1f} MiB "
        f"(+{per_plugin:.0f} KiB per plugin) | plugin helper {mib['helper_100']:.1f} MiB",
    )
