"""The ops endpoint over real loopback TCP, with a fake agent view."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import prometheus_client
import pytest
import trio

from nodeagent.core.component import FatalError
from nodeagent.core.errors import ConfigError
from nodeagent.service.http import Request
from nodeagent.service.ops import OpsServer, readyz_response
from nodeagent.service.opsconn import ConnectionSlots
from nodeagent.service.settings import OpsSettings
from nodeagent.service.supervisor import ComponentReport
from nodeagent.service.views import config_document

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
        # The agent's /v1/config shape: the effective config and the dynamic-config states.
        return config_document({"ops": {"address": "x"}}, None)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[tuple[OpsServer, FakeView]]:
    view = FakeView()
    ops = OpsServer(
        OpsSettings(
            address="127.0.0.1:0",
            request_timeout=0.5,
            head_timeout=0.5,
            read_timeout=0.5,
            max_header_bytes=1024,
        ),
        view,
    )
    await nursery.start(ops.run)
    yield ops, view


async def raw(ops: OpsServer | str | None, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request to a server's main listener, or to the listener at that address."""
    address = ops.address if isinstance(ops, OpsServer) else ops
    assert address is not None
    host, port = address.rsplit(":", 1)
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
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def get(
    ops: OpsServer | str | None, path: str, extra: str = ""
) -> tuple[int, dict[str, str], bytes]:
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
    assert status == 503 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["ready"] is False
    assert [c["name"] for c in doc["components"]] == ["plugins", "kube"]
    assert doc["components"][1]["reason"] == "failed: boom"


async def test_metrics_and_json_views(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    status, headers, body = await get(ops, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    assert b"nodeagent_loop_lag_seconds" in body
    status, _, body = await get(ops, "/v1/plugins")
    assert json.loads(body) == [{"name": "p1", "type": "ReporterPlugin"}]
    assert json.loads((await get(ops, "/v1/status"))[2])["node"] == "n1"
    assert json.loads((await get(ops, "/v1/config"))[2]) == {
        "effective": {"ops": {"address": "x"}},
        "dynamic": None,
    }
    assert json.loads((await get(ops, "/v1/cnr"))[2])["cnr"] == {"kind": "CustomNodeResource"}


async def test_errors(server: tuple[OpsServer, FakeView]) -> None:
    ops, view = server
    assert (await get(ops, "/nope"))[0] == 404
    assert (await raw(ops, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
    assert (await raw(ops, b"garbage\r\n\r\n"))[0] == 400
    assert (await raw(ops, b"GET / HTTP/1.1\r\nX: " + b"a" * 2000 + b"\r\n\r\n"))[0] == 431
    view.fail_plugins = True
    status, _, body = await get(ops, "/v1/plugins")
    assert status == 500 and b"manager exploded" in body
    # The server survived all of that.
    assert (await get(ops, "/healthz"))[0] == 200


async def test_head_has_headers_only(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    status, headers, body = await raw(ops, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and headers["content-length"] == "3" and body == b""


async def test_slow_client_times_out(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    # Never sends the blank line: the read timeout answers 408 and closes.
    status, _, _ = await raw(ops, b"GET /healthz HTTP/1.1\r\n")
    assert status == 408


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


def counter(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def address(ops_address: str | None) -> tuple[str, int]:
    assert ops_address is not None
    host, port = ops_address.rsplit(":", 1)
    return host, int(port)


async def wait_for(condition: Callable[[], bool]) -> None:
    # The accept happens in the kernel and the server's task; poll it, bounded.
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def test_idle_connections_are_evicted_oldest_first_for_a_probe(
    nursery: trio.Nursery,
) -> None:
    ops = OpsServer(OpsSettings(address="127.0.0.1:0", max_connections=2), FakeView())
    await nursery.start(ops.run)
    evicted = counter("nodeagent_ops_connections_total", listener="main", outcome="evicted")
    first = await trio.open_tcp_stream(*address(ops.address))
    await wait_for(lambda: ops.main.slots.open["ordinary"] == 1)
    second = await trio.open_tcp_stream(*address(ops.address))
    await wait_for(lambda: ops.main.slots.open["ordinary"] == 2)
    # Both slots are held by idle clients (the old code answered this 503).
    assert (await get(ops, "/healthz"))[::2] == (200, b"ok\n")
    assert counter("nodeagent_ops_connections_total", listener="main", outcome="evicted") == (
        evicted + 1
    )
    with trio.fail_after(5):
        assert await first.receive_some(100) == b""  # the oldest was closed, unanswered
    await second.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(5):
        assert (await second.receive_some(100)).startswith(b"HTTP/1.1 200 ")
    await first.aclose()
    await second.aclose()


class HugeStatus(FakeView):
    def status(self) -> dict[str, Any]:
        # Far more than loopback socket buffers hold: a client that does not read keeps its
        # connection busy (not idle, not evictable) until request_timeout.
        return {"blob": "x" * (64 * 1024 * 1024)}


async def test_reserved_slots_answer_probes_when_every_slot_is_busy(
    nursery: trio.Nursery,
) -> None:
    ops = OpsServer(
        OpsSettings(address="127.0.0.1:0", max_connections=1, request_timeout=30),
        HugeStatus(),
    )
    await nursery.start(ops.run)
    hog = await trio.open_tcp_stream(*address(ops.address))
    await hog.send_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
    # The hog never reads: once its head is parsed it is busy, not idle.
    await wait_for(lambda: ops.main.slots.open["ordinary"] == 1 and not ops.main.slots._idle)
    assert (await get(ops, "/healthz"))[::2] == (200, b"ok\n")
    assert (await get(ops, "/readyz"))[::2] == (200, b"ok\n")
    not_probe = counter("nodeagent_ops_bad_requests_total", listener="main", reason="not_probe")
    status, _, body = await get(ops, "/metrics")
    assert status == 503 and b"reserved for /healthz and /readyz" in body
    assert counter("nodeagent_ops_bad_requests_total", listener="main", reason="not_probe") == (
        not_probe + 1
    )
    await hog.aclose()


async def test_slots_refuse_when_every_slot_is_busy_and_log_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slots = ConnectionSlots("test", max_connections=1, probe_connections=1)
    refused = counter("nodeagent_ops_connections_total", listener="test", outcome="refused")
    with caplog.at_level("WARNING"):
        a, b = slots.admit(), slots.admit()
        assert a is not None and b is not None
        # b took the last ordinary slot's idle holder's place: a was evicted.
        assert a.evicted and a.scope.cancel_called and b.slot == "ordinary"
        slots.busy(b)
        c = slots.admit()
        assert c is not None and c.slot == "reserved"
        slots.busy(c)
        assert slots.admit() is None
        assert slots.admit() is None
    assert counter("nodeagent_ops_connections_total", listener="test", outcome="refused") == (
        refused + 2
    )
    # Rate-limited: one line for the whole burst.
    lines = [r for r in caplog.records if "under pressure" in r.getMessage()]
    assert len(lines) == 1
    slots.release(a)  # evicted: its slot was handed over already
    slots.release(b)
    slots.release(c)
    assert slots.open == {"ordinary": 0, "reserved": 0}


async def test_bad_requests_and_timeouts_are_counted(
    server: tuple[OpsServer, FakeView],
) -> None:
    ops, _ = server

    def bad(reason: str) -> float:
        return counter("nodeagent_ops_bad_requests_total", listener="main", reason=reason)

    before = {r: bad(r) for r in ("malformed", "head_too_large", "version", "method")}
    timed_out = counter("nodeagent_ops_connections_total", listener="main", outcome="timed_out")
    assert (await raw(ops, b"\x16\x03\x01garbage\r\n\r\n"))[0] == 400
    assert (await raw(ops, b"GET / HTTP/1.1\r\nX: " + b"a" * 2000))[0] == 431
    assert (await raw(ops, b"GET / HTTP/3.0\r\nHost: x\r\n\r\n"))[0] == 505
    assert (await raw(ops, b"DELETE /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
    assert (await raw(ops, b"GET /healthz HTTP/1.1\r\n"))[0] == 408
    assert {r: bad(r) - before[r] for r in before} == dict.fromkeys(before, 1.0)
    assert (
        counter("nodeagent_ops_connections_total", listener="main", outcome="timed_out")
        == timed_out + 1
    )


async def test_pipelined_requests_get_one_answer_and_a_close(
    server: tuple[OpsServer, FakeView],
) -> None:
    ops, _ = server
    status, headers, body = await raw(
        ops, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/config HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert (status, body, headers["connection"]) == (200, b"ok\n", "close")


async def test_not_found_escapes_control_characters(server: tuple[OpsServer, FakeView]) -> None:
    ops, _ = server
    status, _, body = await raw(ops, b"GET /%1b[2J%07 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404 and body == b"not found: /\\x1b[2J\\x07\n"


async def test_public_listener_serves_probes_and_metrics_only(nursery: trio.Nursery) -> None:
    ops = OpsServer(OpsSettings(address="127.0.0.1:0", public_address="127.0.0.1:0"), FakeView())
    await nursery.start(ops.run)
    assert ops.public_address is not None and ops.public_address != ops.address
    public = ops.public_address
    assert (await get(public, "/healthz"))[::2] == (200, b"ok\n")
    assert (await get(public, "/readyz"))[::2] == (200, b"ok\n")
    assert (await get(public, "/metrics"))[0] == 200
    for path in ("/", "/v1/config", "/v1/status", "/v1/plugins", "/nope"):
        assert (await get(public, path))[0] == 404, path
    # The main listener still serves everything.
    assert (await get(ops, "/v1/config"))[0] == 200


async def test_public_readyz_names_components_without_reasons(nursery: trio.Nursery) -> None:
    view = FakeView()
    view.reports = [OK, DOWN]
    ops = OpsServer(OpsSettings(address="127.0.0.1:0", public_address="127.0.0.1:0"), view)
    await nursery.start(ops.run)
    public = ops.public_address
    status, _, body = await get(public, "/readyz?verbose")
    assert status == 503
    assert body == b"[+]plugins ok\n[-]kube not ready\nreadyz check failed\n"
    status, _, body = await get(public, "/readyz?format=json")
    assert json.loads(body) == {
        "ready": False,
        "components": [{"name": "plugins", "ready": True}, {"name": "kube", "ready": False}],
    }
    # On the node (the main listener) the reasons are there.
    assert b"failed: boom" in (await get(ops, "/readyz"))[2]


async def test_unusable_public_address_is_fatal() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ops = OpsServer(
            OpsSettings(address="127.0.0.1:0", public_address=f"127.0.0.1:{port}"), FakeView()
        )
        with pytest.raises(FatalError, match=f"ops.public_address 127.0.0.1:{port}"):
            await ops.run()


class ReporterView(FakeView):
    def plugins(self) -> list[dict[str, Any]]:
        fields = [
            {"fieldType": "Status", "fieldName": "resources", "value": "eyJjcHUiOiAiNCJ9"},
            {"fieldName": "raw", "value": "//79"},  # b"\xff\xfe\xfd": not JSON
        ]
        return [
            {
                "name": "r",
                "type": "ReporterPlugin",
                "last_message": {"content": [{"field": fields}]},
            },
            {"name": "d", "type": "DRAPlugin", "last_message": {"value": "eyJ9"}},
        ]


async def test_plugins_view_shows_reporter_values_as_json(nursery: trio.Nursery) -> None:
    ops = OpsServer(OpsSettings(address="127.0.0.1:0"), ReporterView())
    await nursery.start(ops.run)
    doc = json.loads((await get(ops, "/v1/plugins"))[2])
    fields = doc[0]["last_message"]["content"][0]["field"]
    assert fields[0] == {"fieldType": "Status", "fieldName": "resources", "value": {"cpu": "4"}}
    assert fields[1]["value_base64"] == "//79" and "value" not in fields[1]
    assert fields[1]["value_note"].startswith("not JSON (3 bytes)")
    assert doc[1]["last_message"] == {"value": "eyJ9"}  # other plugin types untouched


async def test_bytes_in_any_view_are_not_python_reprs(nursery: trio.Nursery) -> None:
    class BytesView(FakeView):
        def cnr(self) -> dict[str, Any]:
            return {"json": b'{"a": 1}', "binary": b"\xff"}

    ops = OpsServer(OpsSettings(address="127.0.0.1:0"), BytesView())
    await nursery.start(ops.run)
    doc = json.loads((await get(ops, "/v1/cnr"))[2])
    assert doc["json"] == {"a": 1}
    assert doc["binary"]["base64"] == "/w==" and "not JSON" in doc["binary"]["note"]


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"public_address": "localhost:9465"}, "ops.public_address", "literal IP address"),
        ({"public_address": "0.0.0.0"}, "ops.public_address", "HOST:PORT"),
        ({"head_timeout": 0}, "ops.head_timeout", "> 0"),
        ({"read_timeout": float("nan")}, "ops.read_timeout", "finite"),
        ({"read_timeout": 5.0}, "ops.read_timeout", "<= ops.head_timeout (3)"),
        ({"probe_connections": 0}, "ops.probe_connections", "1..1000"),
    ],
)
def test_invalid_ops_settings_name_the_field(fields: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        OpsSettings(**fields).validate()
    assert field in str(info.value) and rule in str(info.value)


def test_public_address_off_by_default_and_valid_when_set() -> None:
    OpsSettings().validate()
    OpsSettings(public_address="[::]:9465").validate()
    assert OpsServer(OpsSettings(), FakeView()).public is None
