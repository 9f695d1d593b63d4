"""The ops endpoint over real loopback TCP, with a fake agent view."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from nodeagent.service.component import FatalError
from nodeagent.service.http import Request
from nodeagent.service.ops import OpsServer, readyz_response
from nodeagent.service.settings import OpsSettings
from nodeagent.service.supervisor import ComponentReport

OK = ComponentReport("plugins", True, "2 plugins registered", "running", 0, None)
DOWN = ComponentReport("kube", False, "failed: boom", "backoff", 3, "boom", 1.5)


class FakeView:
    def __init__(self) -> None:
        self.alive: tuple[bool, float | None] = (True, 0.1)
        self.reports = [OK]
        self.fail_plugins = False

    def liveness(self) -> tuple[bool, float | None]:
        return self.alive

    def readiness(self) -> list[ComponentReport]:
        return self.reports

    def status(self) -> dict[str, Any]:
        return {"node": "n1", "components": [r.to_json() for r in self.reports]}

    def plugins(self) -> list[dict[str, Any]]:
        if self.fail_plugins:
            raise RuntimeError("manager exploded")
        return [{"name": "p1", "type": "ReporterPlugin"}]

    def resourceslices(self) -> dict[str, Any]:
        return {"node": "n1", "mode": "standalone", "drivers": {}}

    def cnr(self) -> dict[str, Any]:
        return {"node": "n1", "mode": "standalone", "cnr": {"kind": "CustomNodeResource"}}

    def effective_config(self) -> dict[str, Any]:
        return {"ops": {"address": "x"}}


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[tuple[OpsServer, FakeView]]:
    view = FakeView()
    ops = OpsServer(
        OpsSettings(address="127.0.0.1:0", request_timeout=0.5, max_header_bytes=1024), view
    )
    await nursery.start(ops.run)
    yield ops, view


async def raw(ops: OpsServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    assert ops.address is not None
    host, port = ops.address.rsplit(":", 1)
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(data)
            chunks = []
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def get(ops: OpsServer, path: str, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    return await raw(ops, f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())


async def test_healthz(server: tuple[OpsServer, FakeView]) -> None:
    ops, view = server
    assert (await get(ops, "/healthz"))[::2] == (200, b"ok\n")
    view.alive = (False, 12.34)
    status, _, body = await get(ops, "/healthz")
    assert status == 503 and b"last tick 12.3s ago" in body


async def test_readyz_text_json_and_verbose(server: tuple[OpsServer, FakeView]) -> None:
    ops, view = server
    assert (await get(ops, "/readyz"))[::2] == (200, b"ok\n")
    status, _, body = await get(ops, "/readyz?verbose")
    assert status == 200
    assert body == b"[+]plugins ok: 2 plugins registered\nreadyz check passed\n"
    view.reports = [OK, DOWN]
    status, headers, body = await get(ops, "/readyz")
    assert status == 503
    assert body == b"[-]kube not ready: failed: boom (restart in 1.5s)\nreadyz check failed\n"
    status, headers, body = await get(ops, "/readyz", "Accept: application/json\r\n")
    assert status == 503 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["ready"] is False
    assert [c["name"] for c in doc["components"]] == ["plugins", "kube"]
    assert doc["components"][1]["reason"] == "failed: boom"


async def test_metrics_and_json_views(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    status, headers, body = await get(ops, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    assert b"nodeagent_loop_lag_seconds" in body
    status, _, body = await get(ops, "/v1/plugins")
    assert json.loads(body) == [{"name": "p1", "type": "ReporterPlugin"}]
    assert json.loads((await get(ops, "/v1/status"))[2])["node"] == "n1"
    assert json.loads((await get(ops, "/v1/config"))[2]) == {"ops": {"address": "x"}}
    assert json.loads((await get(ops, "/v1/cnr"))[2])["cnr"] == {"kind": "CustomNodeResource"}


async def test_errors(server: tuple[OpsServer, FakeView]) -> None:
    ops, view = server
    assert (await get(ops, "/nope"))[0] == 404
    assert (await raw(ops, b"POST /healthz HTTP/1.1\r\n\r\n"))[0] == 405
    assert (await raw(ops, b"garbage\r\n\r\n"))[0] == 400
    assert (await raw(ops, b"GET / HTTP/1.1\r\nX: " + b"a" * 2000 + b"\r\n\r\n"))[0] == 431
    view.fail_plugins = True
    status, _, body = await get(ops, "/v1/plugins")
    assert status == 500 and b"manager exploded" in body
    # The server survived all of that.
    assert (await get(ops, "/healthz"))[0] == 200


async def test_head_has_headers_only(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    status, headers, body = await raw(ops, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert status == 200 and headers["Content-Length"] == "3" and body == b""


async def test_slow_client_times_out(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    # Never sends the blank line: the 0.5 s request timeout answers 408 and closes.
    status, _, _ = await raw(ops, b"GET /healthz HTTP/1.1\r\n")
    assert status == 408


async def test_connection_limit(nursery: trio.Nursery) -> None:
    ops = OpsServer(
        OpsSettings(address="127.0.0.1:0", request_timeout=5, max_connections=1), FakeView()
    )
    await nursery.start(ops.run)
    assert ops.address is not None
    host, port = ops.address.rsplit(":", 1)
    idle = await trio.open_tcp_stream(host, int(port))
    async with idle:
        with trio.fail_after(5):
            # The accept happens in the kernel and the server's task; poll it, bounded.
            while ops._active < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert (await get(ops, "/healthz"))[0] == 503


async def test_cannot_bind_is_fatal() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ops = OpsServer(OpsSettings(address=f"127.0.0.1:{port}"), FakeView())
        with pytest.raises(FatalError, match=f"cannot listen on ops.address 127.0.0.1:{port}"):
            await ops.run()


def test_readyz_json_via_query() -> None:
    request = Request("GET", "/readyz", {"format": ["json"]}, "HTTP/1.1", {})
    status, body, ctype = readyz_response([OK], request)
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body)["ready"] is True
