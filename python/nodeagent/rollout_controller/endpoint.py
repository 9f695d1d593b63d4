"""The controller's HTTP endpoint: ``/metrics`` (Prometheus text) and ``/healthz`` (200 while
the process runs its loop). A few lines of HTTP/1.0 on Trio: two fixed GETs need no server."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
import trio

from nodeagent.log import get_logger

log = get_logger(__name__)

__all__ = ["serve"]

_MAX_REQUEST = 8192


def _response(code: int, reason: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.0 {code} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def answer(request_line: str, healthy: Callable[[], bool]) -> bytes:
    parts = request_line.split()
    path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
    if len(parts) < 2 or parts[0] != "GET":
        return _response(405, "Method Not Allowed", b"GET only\n", "text/plain")
    if path == "/metrics":
        return _response(
            200, "OK", prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
        )
    if path == "/healthz":
        ok = healthy()
        return _response(
            200 if ok else 503,
            "OK" if ok else "Service Unavailable",
            b"ok\n" if ok else b"not ok\n",
            "text/plain",
        )
    return _response(404, "Not Found", b"not found\n", "text/plain")


async def _handle(stream: trio.SocketStream, healthy: Callable[[], bool]) -> None:
    data = b""
    with trio.move_on_after(10):
        try:
            while b"\r\n\r\n" not in data and b"\n\n" not in data and len(data) < _MAX_REQUEST:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
            line = data.split(b"\n", 1)[0].decode("latin-1").strip()
            await stream.send_all(answer(line, healthy))
        except trio.BrokenResourceError:
            pass
    await stream.aclose()


async def serve(
    address: str,
    healthy: Callable[[], bool],
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves until cancelled; reports the bound port (``HOST:0`` picks one)."""
    host, _, port = address.rpartition(":")
    listeners = await trio.open_tcp_listeners(int(port), host=host.strip("[]") or None)
    bound = listeners[0].socket.getsockname()[1]
    log.info("serving /metrics and /healthz", address=f"{host}:{bound}")
    task_status.started(bound)

    async def handler(stream: trio.SocketStream) -> None:
        await _handle(stream, healthy)

    await trio.serve_listeners(handler, listeners)
