"""Prepare latency of an SDK DRA driver, as the kubelet sees it, against the bare gRPC round trip.

Both sides are called the way the kubelet calls a driver: `NodePrepareResources` over a real
unix socket (one claim per call, as the kubelet sends one pod's claims), then
`NodeUnprepareResources`. The driver's path is the whole one: the claim read from the real
kube-apiserver (the bench's own harness, 100 allocated claims), the author's callback, the CDI
spec written and fsynced, the checkpoint written and fsynced. The baseline is a DRAPlugin whose
handler answers a ready-made response: what grpclib + the bridge cost without any of it.

Printed: p50 and p99 per claim of both, and the ratio.

Run: .venv/bin/python -m pytest benches/bench_prepare.py --benchmark-only
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from grpclib.server import Stream

from benches.report import client_for, percentile, print_uncaptured
from nodeagent.kube import RESOURCECLAIMS, KubeClient
from nodeagent.protos.dra.v1 import api_grpc, api_pb2
from nodeagent.rpc.bridge import GrpcBridge, open_grpc_bridge
from nodeagent.sdk import Claim, ContainerEdits, DevicePlugin, KubeletPlugin, PreparedDevice
from tests.support.apiserver import ApiServer, start_apiserver

CLAIMS = 100
DRIVER = "gpu.example.com"
RESULTS: dict[str, tuple[float, float]] = {}


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = start_apiserver(tmp_path_factory.mktemp("apiserver"))
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def claims(apiserver: ApiServer) -> list[api_pb2.Claim]:
    async def create() -> list[api_pb2.Claim]:
        out = []
        async with client_for(apiserver, "admin") as admin:
            for i in range(CLAIMS):
                out.append(await _allocated(admin, f"bench-{i}"))
        return out

    return trio.run(create)


async def _allocated(admin: KubeClient, name: str) -> api_pb2.Claim:
    body = {
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
    }
    obj = json.loads(await admin.create(RESOURCECLAIMS, body, "default"))
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
                ]
            }
        }
    }
    await admin.update(RESOURCECLAIMS, obj, "default", subresource="status")
    return api_pb2.Claim(namespace="default", name=name, uid=obj["metadata"]["uid"])


async def prepare(claim: Claim) -> Sequence[PreparedDevice]:
    return [
        PreparedDevice(d, ContainerEdits(env={"GPU_DEVICE_0": d.device})) for d in claim.devices
    ]


class NullDriver(api_grpc.DRAPluginBase):
    """The floor: a ready-made answer, no API read, no files."""

    async def NodePrepareResources(
        self,
        stream: Stream[api_pb2.NodePrepareResourcesRequest, api_pb2.NodePrepareResourcesResponse],
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].devices.add(
                request_names=["gpu"],
                pool_name="node-a",
                device_name="gpu-0",
                cdi_device_ids=["x/y=z"],
            )
        await stream.send_message(response)

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            api_pb2.NodeUnprepareResourcesRequest, api_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        request = await stream.recv_message()
        assert request is not None
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        await stream.send_message(response)


async def _round(bridge: GrpcBridge, endpoint: str, claims: list[api_pb2.Claim]) -> list[float]:
    """Prepare every claim (one call each, timed), then unprepare them all."""
    times = []
    async with bridge.channel(endpoint) as channel:
        stub = channel.stub(api_grpc.DRAPluginStub)
        for claim in claims:
            t = time.perf_counter()
            response = await bridge.unary(
                stub.NodePrepareResources,
                api_pb2.NodePrepareResourcesRequest(claims=[claim]),
                timeout=30,
            )
            times.append(time.perf_counter() - t)
            assert response.claims[claim.uid].error == ""
        for claim in claims:
            await bridge.unary(
                stub.NodeUnprepareResources,
                api_pb2.NodeUnprepareResourcesRequest(claims=[claim]),
                timeout=30,
            )
    return times


def _report(request: pytest.FixtureRequest) -> None:
    if set(RESULTS) != {"baseline", "sdk"}:
        return
    (b50, b99), (s50, s99) = RESULTS["baseline"], RESULTS["sdk"]

    def out(emit: Any) -> None:
        emit(f"\nprepare latency per claim over {CLAIMS} claims (ms): p50 / p99")
        emit(f"  bare gRPC round trip (baseline): {b50 * 1e3:.2f} / {b99 * 1e3:.2f}")
        emit(f"  SDK driver (API read, CDI spec, checkpoint): {s50 * 1e3:.2f} / {s99 * 1e3:.2f}")
        emit(f"  ratio p50: {s50 / b50:.1f}x")

    print_uncaptured(request, out)


@pytest.mark.benchmark(group="DRA prepare (one round = 100 claims prepared and unprepared)")
def test_prepare_baseline(
    benchmark: Any, claims: list[api_pb2.Claim], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    samples: list[float] = []

    async def run() -> None:
        async with (
            open_grpc_bridge() as bridge,
            bridge.serve([NullDriver()], str(tmp_path / "null.sock")),
        ):
            samples.extend(await _round(bridge, str(tmp_path / "null.sock"), claims))

    benchmark.pedantic(lambda: trio.run(run), rounds=3, iterations=1)
    RESULTS["baseline"] = (percentile(samples, 0.5), percentile(samples, 0.99))
    benchmark.extra_info["p50_ms"] = round(RESULTS["baseline"][0] * 1e3, 3)
    benchmark.extra_info["p99_ms"] = round(RESULTS["baseline"][1] * 1e3, 3)
    _report(request)


@pytest.mark.benchmark(group="DRA prepare (one round = 100 claims prepared and unprepared)")
def test_prepare_sdk_driver(
    benchmark: Any,
    apiserver: ApiServer,
    claims: list[api_pb2.Claim],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    samples: list[float] = []

    async def run() -> None:
        async with client_for(apiserver, "admin") as client:
            kubelet = KubeletPlugin(
                prepare=prepare,
                kubelet_dir=str(tmp_path / "kubelet"),
                cdi_dir=str(tmp_path / "cdi"),
                kube_client=client,
            )
            async with (
                open_grpc_bridge() as bridge,
                DevicePlugin.serve(
                    name=DRIVER,
                    registry_dir=str(tmp_path / "agent"),
                    kubelet=kubelet,
                    bridge=bridge,
                ),
            ):
                _, endpoint, _ = kubelet.paths(DRIVER)
                samples.extend(await _round(bridge, endpoint, claims))

    benchmark.pedantic(lambda: trio.run(run), rounds=3, iterations=1)
    RESULTS["sdk"] = (percentile(samples, 0.5), percentile(samples, 0.99))
    benchmark.extra_info["p50_ms"] = round(RESULTS["sdk"][0] * 1e3, 3)
    benchmark.extra_info["p99_ms"] = round(RESULTS["sdk"][1] * 1e3, 3)
    _report(request)
