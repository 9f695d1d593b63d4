"""The ops HTTP endpoint: /healthz, /readyz, /metrics and JSON views under /v1/.

Trio-native on `trio.serve_listeners`; each connection gets one bounded request (h11, head size,
header count, head and read deadlines) and one response with `Connection: close`. A second,
optional listener (`ops.public_address`) serves only what probes and scrapers need.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import prometheus_client
import trio

from nodeagent.core.component import FatalError
from nodeagent.kube import DryRun, not_dry_run_view
from nodeagent.log import get_logger
from nodeagent.service.http import (
    ClientGone,
    HeadLimits,
    HeadTimeout,
    HttpError,
    Request,
    new_connection,
    read_request,
    render_response,
)
from nodeagent.service.metrics import OPS_REQUESTS
from nodeagent.service.opsconn import (
    OPS_BAD_REQUESTS,
    OPS_CONNECTIONS,
    Connection,
    ConnectionSlots,
)
from nodeagent.service.settings import OpsSettings, parse_address
from nodeagent.service.supervisor import ComponentReport
from nodeagent.service.views import json_default, plugins_view

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
    return status, (json.dumps(doc, indent=2, default=json_default) + "\n").encode(), JSON


def _text(status: int, text: str) -> Response:
    return status, text.encode(), TEXT


def format_address(sockaddr: Any) -> str:
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def readyz_response(
    reports: list[ComponentReport], request: Request, *, detail: bool = True
) -> Response:
    """/readyz; without `detail` (the public listener) only names and states, no reasons: those
    carry error messages (paths, addresses, a credential helper's stderr) meant for the node."""
    ready = all(r.ready for r in reports)
    code = 200 if ready else 503
    if request.wants_json():
        components = [
            r.to_json() if detail else {"name": r.name, "ready": r.ready} for r in reports
        ]
        return _json(code, {"ready": ready, "components": components})
    verbose = "verbose" in request.query
    if ready and not verbose:
        return _text(code, "ok\n")
    lines = [
        f"[{'+' if r.ready else '-'}]{r.name} {'ok' if r.ready else 'not ready'}"
        + (f": {r.reason}" if detail else "")
        + ("" if r.restart_in is None or not detail else f" (restart in {r.restart_in:.1f}s)")
        for r in reports
        if verbose or not r.ready
    ]
    lines.append("readyz check passed" if ready else "readyz check failed")
    return _text(code, "\n".join(lines) + "\n")


PROBE_PATHS = frozenset({"/healthz", "/readyz"})
Routes = dict[str, Callable[[Request], Response]]


@dataclass
class Listener:
    """One listening address with its own connection slots and the paths it serves."""

    name: str  # "main" or "public": the metrics' listener label
    setting: str  # the config field, for error messages
    configured: str
    slots: ConnectionSlots
    routes: Routes
    address: str | None = None


class OpsServer:
    """The local HTTP endpoint: owns the listening sockets and a route table over an `AgentView`.

    `run()` listens on `ops.address` (every route) and, if set, `ops.public_address` (probes and
    metrics only); an unusable address is a `FatalError`. Each connection is served in its own
    task: one bounded request (h11 parser, head size, head and read deadlines) and one response
    with `Connection: close`. Slots per listener (`opsconn`) keep probes answered whatever other
    clients do. Handlers only read the view, so a slow client or a failing handler (a 500) never
    affects the agent; nothing escapes a connection's task.
    """

    def __init__(
        self, settings: OpsSettings, view: AgentView, *, dry_run: DryRun | None = None
    ) -> None:
        self.settings = settings
        self.view = view
        # /v1/writes: what a dry-run agent would have written (agent.dry_run).
        self.dry_run = dry_run
        self.limits = HeadLimits(
            max_bytes=settings.max_header_bytes,
            head_timeout=settings.head_timeout,
            read_timeout=settings.read_timeout,
        )
        self._routes: Routes = {
            "/": self._index,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/v1/status": lambda _: _json(200, self.view.status()),
            "/v1/plugins": lambda _: _json(200, plugins_view(self.view.plugins())),
            "/v1/resourceslices": lambda _: _json(200, self.view.resourceslices()),
            "/v1/cnr": lambda _: _json(200, self.view.cnr()),
            "/v1/config": lambda _: _json(200, self.view.effective_config()),
            "/v1/writes": lambda _: _json(
                200, self.dry_run.view() if self.dry_run is not None else not_dry_run_view()
            ),
        }
        # What a kubelet probe and a Prometheus scraper need, and no more: /readyz there names
        # the components but not the reasons (error messages are for the node).
        public_routes: Routes = {
            "/healthz": self._healthz,
            "/readyz": lambda r: readyz_response(self.view.readiness(), r, detail=False),
            "/metrics": self._metrics,
        }
        self.main = self._listener("main", "ops.address", settings.address, self._routes)
        self.public = (
            self._listener("public", "ops.public_address", settings.public_address, public_routes)
            if settings.public_address
            else None
        )

    def _listener(self, name: str, setting: str, address: str, routes: Routes) -> Listener:
        slots = ConnectionSlots(
            name, self.settings.max_connections, self.settings.probe_connections
        )
        return Listener(name, setting, address, slots, routes)

    @property
    def address(self) -> str | None:
        """Where the full endpoint listens (None until `run()` has bound it)."""
        return self.main.address

    @property
    def public_address(self) -> str | None:
        return self.public.address if self.public is not None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = [self.main] + ([self.public] if self.public is not None else [])
        bound: list[list[trio.SocketListener]] = []
        try:
            for listener in listeners:
                bound.append(await self._bind(listener))
        except FatalError:
            for sockets in bound:  # the ones already bound are not served: release them
                for sock in sockets:
                    await sock.aclose()
            raise
        async with trio.open_nursery() as nursery:
            for listener, sockets in zip(listeners, bound, strict=True):
                nursery.start_soon(
                    partial(trio.serve_listeners, partial(self._handle, listener), sockets)
                )
            task_status.started()

    async def _bind(self, listener: Listener) -> list[trio.SocketListener]:
        host, port = parse_address(listener.configured)
        try:
            sockets = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise FatalError(
                f"cannot listen on {listener.setting} {listener.configured}: {exc.strerror or exc}"
            ) from exc
        listener.address = format_address(sockets[0].socket.getsockname())
        log.info(
            "ops endpoint listening",
            listener=listener.name,
            address=listener.address,
            paths=" ".join(p for p in listener.routes if p != "/"),
        )
        return sockets

    async def _handle(self, listener: Listener, stream: trio.SocketStream) -> None:
        # Nothing may escape: an exception here would take down serve_listeners and the agent.
        conn = listener.slots.admit()
        try:
            async with stream:
                if conn is None:
                    await self._refuse(stream)
                    return
                with conn.scope:
                    await self._serve_one(listener, conn, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:
            log.exception("ops connection failed", error=str(exc))
        finally:
            if conn is not None:
                listener.slots.release(conn)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        OPS_REQUESTS.labels(path="other", code="503").inc()
        body = b"too many connections\n"
        # A short bound: a refused client gets one write attempt, not a slot's worth of time.
        with trio.move_on_after(min(self.settings.request_timeout, 1.0)):
            await stream.send_all(render_response(None, 503, body, TEXT))

    async def _serve_one(
        self, listener: Listener, conn: Connection, stream: trio.SocketStream
    ) -> None:
        parser = new_connection(self.limits)
        request: Request | None = None
        try:
            request = await read_request(stream, parser, self.limits)
        except ClientGone:
            return
        except HeadTimeout as exc:
            OPS_CONNECTIONS.labels(listener=listener.name, outcome="timed_out").inc()
            response = _text(exc.status, exc.detail + "\n")
        except HttpError as exc:
            OPS_BAD_REQUESTS.labels(listener=listener.name, reason=exc.reason).inc()
            response = _text(exc.status, exc.detail + "\n")
        else:
            listener.slots.busy(conn)
            response = self._route(listener, conn, request)
        status, body, ctype = response
        known = request is not None and request.path in listener.routes
        path = request.path if request is not None and known else "other"
        OPS_REQUESTS.labels(path=path, code=str(status)).inc()
        head_only = request is not None and request.method == "HEAD"
        with trio.move_on_after(self.settings.request_timeout):
            await stream.send_all(render_response(parser, status, body, ctype, head_only=head_only))
            await stream.send_eof()
            listener.slots.idle(conn)
            # Lingering close: closing with unread request bytes makes the kernel send a RST,
            # which can destroy the response before the client reads it.
            drained = 0
            while drained < _DRAIN_LIMIT and (chunk := await stream.receive_some(16384)):
                drained += len(chunk)

    def _route(self, listener: Listener, conn: Connection, request: Request) -> Response:
        if conn.slot == "reserved" and (request.path.rstrip("/") or "/") not in PROBE_PATHS:
            OPS_BAD_REQUESTS.labels(listener=listener.name, reason="not_probe").inc()
            return _text(503, "too many connections (reserved for /healthz and /readyz)\n")
        response = dispatch(listener.routes, request)
        if response[0] == 405:
            OPS_BAD_REQUESTS.labels(listener=listener.name, reason="method").inc()
        return response

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


def dispatch(routes: Routes, request: Request) -> Response:
    route = routes.get(request.path.rstrip("/") or "/")
    if route is None:
        return _text(404, f"not found: {printable(request.path)}\n")
    if request.method not in ("GET", "HEAD"):
        return _text(405, "method not allowed (GET, HEAD)\n")
    try:
        return route(request)
    except Exception as exc:
        log.exception("ops handler failed", path=printable(request.path), error=str(exc))
        return _text(500, f"internal error: {exc}\n")


def printable(text: str) -> str:
    """`text` with control characters escaped, for echoing client input back."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
