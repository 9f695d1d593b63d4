"""The rollout controller's cost on the apiserver: requests per minute of one
`nodeagent rollout-controller` process at rest and during a rollout, with N simulated nodes
(Node objects whose NodeAgentConfigOK conditions this script writes as their agents would,
through `rollout.rank.admission` and the agent's own condition builders) on a real
kube-apiserver of the test harness.

    .venv/bin/python -m benches.rollout_controller_rate --nodes 100 --nodes 5000

prints, per size, the controller's requests (its own ``nodeagent_api_requests_total``, scraped
from its /metrics) per minute at rest (a Complete rollout, nothing changing) and during a
rollout (a canary of 1 %, waves 25/50/100 %, maxUnavailable 10 %: from the object's creation to
Complete), with the rollout's duration and status writes. Figures: docs/performance/index.md.
Heavy (thousands of Nodes): run it once on a shared machine, not in a loop.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from nodeagent.dynconfig.overlay import config_hash
from nodeagent.dynconfig.state import Assignment, Known, State, Trial
from nodeagent.dynconfig.status import condition_patch, resting_condition
from nodeagent.kube import NODES, KubeClient, load_kubeconfig
from nodeagent.rollout.api import Phase, RolloutStatus, decode_status
from nodeagent.rollout.rank import admission
from tests.support.apiserver import ApiServer, free_ports, start_apiserver
from tests.support.follow import follow_nodeagentconfig
from tests.support.nodeagentconfig import NAC, install_nodeagentconfig_crd, nodeagentconfig
from tests.support.wait import wait_until

CONFIG = {"reporter": {"interval": 23.0}}
PREVIOUS = Known(hash="0000000000000000", name="previous")
ROLLOUT = {"canary": {"percent": 1}, "waves": [25, 50, 100], "maxUnavailable": "10%"}
CONCURRENCY = 32  # parallel writes of the simulated agents and of the Node creation
_REQUESTS = re.compile(r"^nodeagent_api_requests_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_LEADER = re.compile(r"^nodeagent_rollout_leader ([0-9.]+)$", re.M)
_WRITES = re.compile(r'^nodeagent_rollout_status_writes_total\{result="ok"\} ([0-9.e+]+)$', re.M)


def _client(srv: ApiServer) -> KubeClient:
    return KubeClient(load_kubeconfig(str(srv.kubeconfig("admin"))), qps=1000.0, burst=2000)


async def _parallel(jobs: list[Any]) -> None:
    """Runs the coroutine functions in ``jobs``, CONCURRENCY at a time."""
    limit = trio.CapacityLimiter(CONCURRENCY)

    async def one(job: Any) -> None:
        async with limit:
            await job()

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)


async def create_nodes(client: KubeClient, names: list[str], labels: dict[str, str]) -> None:
    async def make(name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        await client.create(NODES, body)

    await _parallel([lambda n=n: make(n) for n in names])


@dataclass
class Agents:
    """The nodes' agents, simulated: an admitted node goes on trial, and through it at the next
    status the controller writes (it has seen the trial)."""

    client: KubeClient
    nodes: list[str]
    obj: str
    trial: set[str]
    done: set[str]
    last: RolloutStatus | None = None

    async def _write(self, node: str, state: State, active: Known) -> None:
        patch = condition_patch(resting_condition(state, active, None), time.time())
        await self.client.patch(NODES, node, patch, type="strategic", subresource="status")

    async def step(self, obj: dict[str, Any]) -> None:
        status = decode_status((obj.get("status") or {}).get("rollout"))
        if status is None or status == self.last:
            return
        self.last = status
        meta = obj["metadata"]
        hash_ = config_hash(obj["spec"]["config"])
        mine = Known(hash=hash_, name=meta["name"])
        assigned = Assignment(
            name=meta["name"], uid=meta["uid"], generation=meta["generation"], config=CONFIG
        )
        active = State(assigned=msgspec.structs.replace(assigned, hash=hash_))
        jobs: list[Any] = []
        for node in sorted(self.trial):
            self.trial.discard(node)
            self.done.add(node)
            jobs.append(lambda n=node: self._write(n, active, mine))
        trial = State(trial=Trial(hash=hash_, name=meta["name"], started_at=time.time()))
        for node in self.nodes:
            if node in self.trial or node in self.done:
                continue
            if admission(node, False, meta["uid"], hash_, status, name=meta["name"]).admitted:
                self.trial.add(node)
                jobs.append(lambda n=node: self._write(n, trial, PREVIOUS))
        await _parallel(jobs)

    async def run(self) -> None:
        await follow_nodeagentconfig(self.client, self.obj, self.step)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def scrape(port: int) -> tuple[float, bool]:
    """The controller's API requests so far, and whether it leads."""
    text = _metrics(port)
    leader = _LEADER.search(text)
    return sum(float(v) for v in _REQUESTS.findall(text)), bool(leader and float(leader[1]))


def status_writes(port: int) -> float:
    found = _WRITES.search(_metrics(port))
    return float(found[1]) if found else 0.0


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def measure(srv: ApiServer, nodes: int, rest: float) -> dict[str, float]:
    names = [f"sim-{nodes}-{i:05d}" for i in range(nodes)]
    async with _client(srv) as client:
        await install_nodeagentconfig_crd(client)
        t0 = time.monotonic()
        # Each size its own nodes (an earlier size's stay, targeted by nothing of this one).
        labels = {"rate": str(nodes)}
        await create_nodes(client, names, labels)
        setup = time.monotonic() - t0
        (port,) = free_ports(1)
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "nodeagent",
                "rollout-controller",
                f"--kubeconfig={srv.kubeconfig('admin')}",
                "--namespace=default",
                f"--lease-name=rate-{nodes}",
                "--identity=rate",
                f"--metrics-address=127.0.0.1:{port}",
                "--qps=1000",
                "--burst=2000",
                "--log-level=warning",
            ]
        )
        try:

            async def leading() -> bool:
                try:
                    return (await trio.to_thread.run_sync(scrape, port))[1]
                except OSError:
                    return False

            await wait_until(leading, "the controller leading", timeout=120, interval=0.5)
            # At rest with nothing to roll out (the watches and the Lease only).
            idle0, _ = scrape(port)
            await trio.sleep(rest)
            idle1, _ = scrape(port)
            obj = f"rate-{nodes}"
            spec = {
                "nodeSelector": {"matchLabels": labels},
                "config": CONFIG,
                "rollout": ROLLOUT,
            }
            agents = Agents(client, names, obj, set(), set())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agents.run)
                start, _ = scrape(port)
                t1 = time.monotonic()
                await client.create(NAC, nodeagentconfig(obj, spec=spec))

                def complete() -> bool:
                    return agents.last is not None and agents.last.phase == Phase.COMPLETE

                await wait_until(complete, "the rollout Complete", timeout=3600, interval=0.5)
                took = time.monotonic() - t1
                end, _ = scrape(port)
                writes = status_writes(port)
                rss = rss_mib(proc.pid)
                nursery.cancel_scope.cancel()
            # At rest after the rollout (a Complete object, nothing changing).
            rest0, _ = scrape(port)
            await trio.sleep(rest)
            rest1, _ = scrape(port)
            await client.delete(NAC, obj)
        finally:
            proc.terminate()
            with trio.move_on_after(30):
                await proc.wait()
    return {
        "nodes": nodes,
        "setup_s": setup,
        "idle_per_min": (idle1 - idle0) * 60 / rest,
        "rollout_s": took,
        "rollout_requests": end - start,
        "rollout_per_min": (end - start) * 60 / took,
        "rest_per_min": (rest1 - rest0) * 60 / rest,
        "status_writes": writes,
        "rss_mib": rss,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (repeatable)")
    parser.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest")
    args = parser.parse_args(argv)
    sizes = args.nodes or [100]
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_apiserver(pathlib.Path(tmp))
        try:
            for size in sizes:
                result = trio.run(measure, srv, size, args.rest)
                print(
                    f"{size} nodes (created in {result['setup_s']:.0f} s): "
                    f"idle {result['idle_per_min']:.0f} req/min; rollout "
                    f"{result['rollout_s']:.0f} s, {result['rollout_requests']:.0f} requests = "
                    f"{result['rollout_per_min']:.0f} req/min ({result['status_writes']:.0f} "
                    f"status writes); at rest after it {result['rest_per_min']:.0f} req/min; "
                    f"controller RSS {result['rss_mib']:.0f} MiB",
                    flush=True,
                )
        finally:
            srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
