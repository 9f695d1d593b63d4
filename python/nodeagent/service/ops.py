"""The ops HTTP endpoint: /healthz, /readyz, /metrics and JSON views under /v1/.

Trio-native on `trio.serve_listeners`; each connection gets one bounded request (head size,
header count, timeout) and one response with `Connection: close`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import prometheus_client
import trio

from nodeagent.log import get_logger
from nodeagent.service.component import FatalError
from nodeagent.service.http import (
    HttpError,
    Request,
    parse_request_head,
    read_head,
    render_response,
)
from nodeagent.service.metrics import OPS_REQUESTS
from nodeagent.service.settings import OpsSettings, parse_address
from nodeagent.service.supervisor import ComponentReport

log = get_logger(__name__)

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"

Response = tuple[int, bytes, str]
_DRAIN_LIMIT = 256 * 1024


class AgentView(Protocol):
    """What the endpoint shows; the agent implements it, tests can fake it."""

    def liveness(self) -> tuple[bool, float | None]: ...

    def readiness(self) -> list[ComponentReport]: ...

    def status(self) -> dict[str, Any]: ...

    def plugins(self) -> list[dict[str, Any]]: ...

    def resourceslices(self) -> dict[str, Any]: ...

    def cnr(self) -> dict[str, Any]: ...

    def effective_config(self) -> dict[str, Any]: ...


def _json(status: int, doc: object) -> Response:
    return status, (json.dumps(doc, indent=2, default=str) + "\n").encode(), JSON


def _text(status: int, text: str) -> Response:
    return status, text.encode(), TEXT


def format_address(sockaddr: Any) -> str:
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def readyz_response(reports: list[ComponentReport], request: Request) -> Response:
    ready = all(r.ready for r in reports)
    code = 200 if ready else 503
    if request.wants_json():
        return _json(code, {"ready": ready, "components": [r.to_json() for r in reports]})
    verbose = "verbose" in request.query
    if ready and not verbose:
        return _text(code, "ok\n")
    lines = [
        f"[{'+' if r.ready else '-'}]{r.name} {'ok' if r.ready else 'not ready'}: {r.reason}"
        + ("" if r.restart_in is None else f" (restart in {r.restart_in:.1f}s)")
        for r in reports
        if verbose or not r.ready
    ]
    lines.append("readyz check passed" if ready else "readyz check failed")
    return _text(code, "\n".join(lines) + "\n")


class OpsServer:
    """The local HTTP endpoint: owns the listening socket and a route table over an `AgentView`.

    `run()` listens on `ops.address` (an unusable address is a `FatalError`) and serves each
    connection in its own task: one bounded request (head size, timeout, connection limit) and
    one response with `Connection: close`. Handlers only read the view, so a slow client or a
    failing handler (a 500) never affects the agent; nothing escapes a connection's task.
    """

    def __init__(self, settings: OpsSettings, view: AgentView) -> None:
        self.settings = settings
        self.view = view
        self.address: str | None = None
        self._active = 0
        self._routes: dict[str, Callable[[Request], Response]] = {
            "/": self._index,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/v1/status": lambda _: _json(200, self.view.status()),
            "/v1/plugins": lambda _: _json(200, self.view.plugins()),
            "/v1/resourceslices": lambda _: _json(200, self.view.resourceslices()),
            "/v1/cnr": lambda _: _json(200, self.view.cnr()),
            "/v1/config": lambda _: _json(200, self.view.effective_config()),
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_address(self.settings.address)
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise FatalError(
                f"cannot listen on ops.address {self.settings.address}: {exc.strerror or exc}"
            ) from exc
        sock = listeners[0].socket
        self.address = format_address(sock.getsockname())
        log.info("ops endpoint listening", address=self.address)
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        # Nothing may escape: an exception here would take down serve_listeners and the agent.
        self._active += 1
        try:
            async with stream:
                await self._serve_one(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:
            log.exception("ops connection failed", error=str(exc))
        finally:
            self._active -= 1

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        request: Request | None = None
        if self._active > self.settings.max_connections:
            response = _text(503, "too many connections\n")
        else:
            with trio.move_on_after(self.settings.request_timeout) as scope:
                try:
                    head = await read_head(stream, self.settings.max_header_bytes)
                    request = parse_request_head(head)
                    response = self.dispatch(request)
                except HttpError as exc:
                    response = _text(exc.status, exc.detail + "\n")
            if scope.cancelled_caught:
                response = _text(408, "request timeout\n")
        status, body, ctype = response
        path = request.path if request is not None and request.path in self._routes else "other"
        OPS_REQUESTS.labels(path=path, code=str(status)).inc()
        head_only = request is not None and request.method == "HEAD"
        with trio.move_on_after(self.settings.request_timeout):
            await stream.send_all(render_response(status, body, ctype, head_only=head_only))
            await stream.send_eof()
            # Lingering close: closing with unread request bytes makes the kernel send a RST,
            # which can destroy the response before the client reads it.
            drained = 0
            while drained < _DRAIN_LIMIT and (chunk := await stream.receive_some(16384)):
                drained += len(chunk)

    def dispatch(self, request: Request) -> Response:
        route = self._routes.get(request.path.rstrip("/") or "/")
        if route is None:
            return _text(404, f"not found: {request.path}\n")
        if request.method not in ("GET", "HEAD"):
            return _text(405, "method not allowed (GET, HEAD)\n")
        try:
            return route(request)
        except Exception as exc:
            log.exception("ops handler failed", path=request.path, error=str(exc))
            return _text(500, f"internal error: {exc}\n")

    def _index(self, _: Request) -> Response:
        return _text(200, "".join(f"{p}\n" for p in self._routes if p != "/"))

    def _healthz(self, _: Request) -> Response:
        alive, age = self.view.liveness()
        if alive:
            return _text(200, "ok\n")
        if age is None:
            return _text(503, "main loop has not ticked yet\n")
        return _text(503, f"main loop heartbeat stale: last tick {age:.1f}s ago\n")

    def _readyz(self, request: Request) -> Response:
        return readyz_response(self.view.readiness(), request)

    def _metrics(self, _: Request) -> Response:
        return 200, prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
