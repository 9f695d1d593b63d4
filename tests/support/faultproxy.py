"""A loopback fault-injection proxy between a Kubernetes client and the real apiserver.

It runs its own Trio loop in a background thread, so a test (or `python -m tests.faults.matrix`)
scripts it from ordinary synchronous code::

    with FaultProxy(apiserver) as proxy:               # TLS passed through at the TCP level
        kubeconfig = proxy.url                           # point the agent at it
        proxy.cut_all()                                  # every open stream closed (FIN)
        proxy.reset_all()                                # ... or reset (RST)
        proxy.stall()                                    # open streams go silent (no FIN)
        proxy.refuse(True)                               # the port refuses connections
        proxy.set_latency(0.2)                           # each chunk delayed

    with FaultProxy(apiserver, terminate_tls=True) as proxy:   # HTTP-level faults
        proxy.respond(429, n=3, retry_after=1)           # the next 3 requests get 429
        proxy.respond(503, n=5, match="resourceslices")  # a burst of 503 on slices
        proxy.reset_mid_response(n=1, after=200)         # RST 200 bytes into a response

Two modes:

* pass-through (default): bytes are relayed as they are, so client certificates and tokens
  authenticate end to end; faults act on TCP connections.
* ``terminate_tls=True``: the proxy serves TLS with the apiserver's own serving certificate
  (issued by the harness CA for 127.0.0.1, so the client's CA check passes) and asks for a
  client certificate; each request is re-originated to the apiserver over a new TLS connection
  presenting the same identity's certificate (the proxy knows every harness identity's key, and
  `add_identity` adds rotated ones). Bearer tokens pass through in the request headers.
  Requests are parsed (HTTP/1.1 heads and ``Content-Length`` bodies), logged in `requests`,
  and injected responses are answered by the proxy itself. A forwarded request is sent with
  ``Connection: close`` and its connection then relayed byte for byte (watches included), so
  the client opens a new connection for its next request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from tests.support.apiserver import ApiServer

__all__ = ["FaultProxy", "LoggedRequest"]

T = TypeVar("T")
_CHUNK = 65536
_MAX_HEAD = 65536


@dataclass
class LoggedRequest:
    """One request seen in terminate mode."""

    at: float  # time.monotonic()
    method: str
    path: str
    status: int  # the injected status, or the apiserver's (0: no answer seen)
    injected: bool
    identity: str  # the client certificate's identity, "" for none (token)


@dataclass
class _Rule:
    status: int
    left: int
    retry_after: float | None
    match: str
    method: str


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Conn:
    scope: trio.CancelScope
    sockets: list[trio.SocketStream] = field(default_factory=list)
    stalled: bool = False
    resume: trio.Event = field(default_factory=trio.Event)


class FaultProxy:
    """See the module docstring. ``upstream`` is the harness apiserver."""

    def __init__(self, upstream: ApiServer, *, terminate_tls: bool = False) -> None:
        self.upstream = upstream
        self.terminate_tls = terminate_tls
        host, port = upstream.url.removeprefix("https://").rsplit(":", 1)
        self._up = (host, int(port))
        self.port = 0
        self.requests: list[LoggedRequest] = []
        self.connections_total = 0
        self.errors: list[Exception] = []  # unexpected errors of single connections
        self._latency = 0.0
        self._stall_new = False
        self._refusing = False
        self._rules: list[_Rule] = []
        self._resets: list[tuple[int, str]] = []  # (bytes of response to let through, match)
        self._reject_tokens: set[str] = set()
        self._conns: set[_Conn] = set()
        self._identities: dict[bytes, tuple[str, ssl.SSLContext]] = {}
        self._server_ctx: ssl.SSLContext | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._listener_scope: trio.CancelScope | None = None
        self._listener_closed: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        if terminate_tls:
            self._server_ctx = ssl.create_default_context(
                ssl.Purpose.CLIENT_AUTH, cafile=str(upstream.ca_file)
            )
            self._server_ctx.load_cert_chain(
                str(upstream.dir / "apiserver.crt"), str(upstream.dir / "apiserver.key")
            )
            self._server_ctx.verify_mode = ssl.CERT_OPTIONAL
            for name in ("admin", *upstream.nodes):
                crt, key = upstream.cert_files(name)
                self.add_identity(name, crt, key)

    # -- lifecycle ----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            stop = self._stop
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._listen)
            self._started.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _listen(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        closed = self._listener_closed = trio.Event()
        try:
            await self._accept_loop(task_status)
        finally:
            closed.set()

    async def _accept_loop(self, task_status: Any) -> None:
        with trio.CancelScope() as scope:
            self._listener_scope = scope
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started()
            async with listeners[0]:
                while True:
                    stream = await listeners[0].accept()
                    self.connections_total += 1
                    assert self._nursery is not None
                    self._nursery.start_soon(self._handle, stream)

    def _call(self, fn: Callable[[], T]) -> T:
        assert self._token is not None, "FaultProxy not started"
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    # -- faults (call from any thread but the proxy's) ----------------------

    def cut_all(self) -> int:
        """Close every open connection (FIN to both sides); return how many."""
        return self._call(lambda: self._close_conns(reset=False))

    def reset_all(self) -> int:
        """Reset every open connection (RST to both sides); return how many."""
        return self._call(lambda: self._close_conns(reset=True))

    def stall(self, new_connections: bool = False) -> int:
        """Open connections stop relaying in both directions, silently (no FIN, no RST): the
        client sees a live but mute socket. With ``new_connections`` connections opened from now
        on stall too. `unstall` relays again. Returns the number of connections stalled."""

        def do() -> int:
            self._stall_new = new_connections
            for conn in self._conns:
                if not conn.stalled:
                    conn.stalled, conn.resume = True, trio.Event()
            return len(self._conns)

        return self._call(do)

    def unstall(self) -> None:
        def do() -> None:
            self._stall_new = False
            for conn in self._conns:
                conn.stalled = False
                conn.resume.set()

        self._call(do)

    def refuse(self, on: bool) -> None:
        """Close the listening socket (connections are refused) or open it again on the same
        port. Open connections are left alone: combine with `cut_all` for a full outage."""

        async def stop() -> None:
            if self._listener_scope is not None:
                self._listener_scope.cancel()
                self._listener_scope = None
                if self._listener_closed is not None:
                    await self._listener_closed.wait()  # refused from the moment we return

        async def listen() -> None:
            assert self._nursery is not None
            await self._nursery.start(self._listen)

        if on != self._refusing:
            self._refusing = on
            assert self._token is not None
            trio.from_thread.run(stop if on else listen, trio_token=self._token)

    def set_latency(self, seconds: float) -> None:
        """Delay every relayed chunk, in both directions, by ``seconds``."""
        self._latency = seconds

    def respond(
        self,
        status: int,
        n: int = 1,
        *,
        retry_after: float | None = None,
        match: str = "",
        method: str = "",
    ) -> None:
        """The next ``n`` requests whose path contains ``match`` (and whose method is
        ``method``, if given) are answered by the proxy with ``status`` and a Kubernetes
        ``Status`` body (terminate mode only)."""
        self._need_terminate()
        self._rules.append(_Rule(status, n, retry_after, match, method.upper()))

    def reset_mid_response(self, n: int = 1, *, after: int = 100, match: str = "") -> None:
        """The next ``n`` forwarded responses (path containing ``match``) are cut with an RST
        after ``after`` bytes (terminate mode only)."""
        self._need_terminate()
        self._resets.extend([(after, match)] * n)

    def reject_token(self, token: str) -> None:
        """Answer 401 to requests carrying this bearer token (a revoked token; terminate
        mode only)."""
        self._need_terminate()
        self._reject_tokens.add(token)

    def add_identity(self, name: str, cert: Path, key: Path) -> None:
        """A client certificate the proxy may see; it presents the same one upstream."""
        ctx = ssl.create_default_context(cafile=str(self.upstream.ca_file))
        ctx.load_cert_chain(str(cert), str(key))
        der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text())
        self._identities[hashlib.sha256(der).digest()] = (name, ctx)

    def clear(self) -> None:
        """Drop every pending fault (latency, rules, resets, stalls, refusal)."""
        self._latency = 0.0
        self._rules.clear()
        self._resets.clear()
        self._reject_tokens.clear()
        self.unstall()
        self.refuse(False)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _need_terminate(self) -> None:
        if not self.terminate_tls:
            raise RuntimeError("HTTP-level faults need FaultProxy(..., terminate_tls=True)")

    # -- relaying -----------------------------------------------------------

    def _close_conns(self, reset: bool) -> int:
        conns = list(self._conns)
        for conn in conns:
            if reset:
                for sock in conn.sockets:
                    _set_rst(sock)
            conn.scope.cancel()
        return len(conns)

    async def _handle(self, client: trio.SocketStream) -> None:
        conn = _Conn(trio.CancelScope(), [client])
        if self._stall_new:
            conn.stalled = True
        self._conns.add(conn)
        try:
            with conn.scope:
                if self.terminate_tls:
                    await self._terminate(conn, client)
                else:
                    upstream = await trio.open_tcp_stream(*self._up)
                    conn.sockets.append(upstream)
                    await self._pump_both(conn, client, upstream, None)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception as exc:
            self.errors.append(exc)
        finally:
            self._conns.discard(conn)
            for sock in conn.sockets:
                with trio.CancelScope(shield=True):
                    await sock.aclose()

    async def _pump_both(
        self,
        conn: _Conn,
        a: trio.abc.Stream,
        b: trio.abc.Stream,
        reset_after: tuple[int, str] | None,
    ) -> None:
        async with trio.open_nursery() as nursery:

            async def one_way(src: trio.abc.Stream, dst: trio.abc.Stream, limit: int) -> None:
                sent = 0
                try:
                    while True:
                        data = await src.receive_some(_CHUNK)
                        while conn.stalled:
                            await conn.resume.wait()
                        if self._latency:
                            await trio.sleep(self._latency)
                        if not data:
                            break
                        if limit >= 0 and sent + len(data) > limit:
                            await dst.send_all(data[: max(0, limit - sent)])
                            for sock in conn.sockets:
                                _set_rst(sock)
                            break
                        await dst.send_all(data)
                        sent += len(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                    pass
                nursery.cancel_scope.cancel()

            limit = reset_after[0] if reset_after else -1
            nursery.start_soon(one_way, a, b, -1)
            nursery.start_soon(one_way, b, a, limit)

    async def _terminate(self, conn: _Conn, client_tcp: trio.SocketStream) -> None:
        assert self._server_ctx is not None
        client = trio.SSLStream(client_tcp, self._server_ctx, server_side=True)
        await client.do_handshake()
        identity, up_ctx = "", ssl.create_default_context(cafile=str(self.upstream.ca_file))
        der = client.getpeercert(binary_form=True)
        if der:
            known = self._identities.get(hashlib.sha256(der).digest())
            if known is None:
                await _send_status(client, 401, "unknown client certificate", None)
                return
            identity, up_ctx = known
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = await client.receive_some(_CHUNK)
                if not data:
                    return
                buf += data
                if len(buf) > _MAX_HEAD:
                    return
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
            hmap = {k.strip().lower(): v.strip() for k, v in headers}
            length = int(hmap.get("content-length", "0"))
            while len(buf) < length:
                data = await client.receive_some(_CHUNK)
                if not data:
                    return
                buf += data
            body, buf = buf[:length], buf[length:]
            token = hmap.get("authorization", "").removeprefix("Bearer ").strip()
            rule = self._take_rule(method, path)
            if token and token in self._reject_tokens:
                rule = _Rule(401, 1, None, "", "")
            if rule is not None:
                self.requests.append(
                    LoggedRequest(time.monotonic(), method, path, rule.status, True, identity)
                )
                await _send_status(client, rule.status, "injected by FaultProxy", rule.retry_after)
                continue
            entry = LoggedRequest(time.monotonic(), method, path, 0, False, identity)
            self.requests.append(entry)
            up_tcp = await trio.open_tcp_stream(*self._up)
            conn.sockets.append(up_tcp)
            upstream = trio.SSLStream(up_tcp, up_ctx, server_hostname=self._up[0])
            kept = [f"{k}:{v}" for k, v in headers if k.strip().lower() != "connection"]
            out = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
            await upstream.send_all(out + body + buf)
            first = await upstream.receive_some(_CHUNK)
            try:
                entry.status = int(first.split(b" ", 2)[1])
            except (IndexError, ValueError):
                entry.status = 0
            reset = self._take_reset(path)
            if reset is not None and len(first) > reset[0]:
                await client.send_all(first[: reset[0]])
                for sock in conn.sockets:
                    _set_rst(sock)
                return
            await client.send_all(first)
            if reset is not None:
                reset = (reset[0] - len(first), reset[1])
            await self._pump_both(conn, client, upstream, reset)
            return

    def _take_rule(self, method: str, path: str) -> _Rule | None:
        for rule in self._rules:
            if rule.left > 0 and rule.match in path and rule.method in ("", method):
                rule.left -= 1
                if rule.left == 0:
                    self._rules.remove(rule)
                return rule
        return None

    def _take_reset(self, path: str) -> tuple[int, str] | None:
        for i, (after, match) in enumerate(self._resets):
            if match in path:
                del self._resets[i]
                return after, match
        return None


_REASONS = {401: "Unauthorized", 429: "Too Many Requests", 500: "Internal Server Error"}
_REASONS |= {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_STATUS_REASON = {401: "Unauthorized", 429: "TooManyRequests", 500: "InternalError"}
_STATUS_REASON |= {503: "ServiceUnavailable", 504: "Timeout"}


async def _send_status(
    stream: trio.abc.Stream, status: int, message: str, retry_after: float | None
) -> None:
    details: dict[str, Any] = {}
    if retry_after is not None:
        details["retryAfterSeconds"] = int(retry_after)
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": _STATUS_REASON.get(status, ""),
            "details": details,
            "code": status,
        }
    ).encode()
    extra = f"Retry-After: {int(retry_after)}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    await stream.send_all(head.encode() + body)


def _set_rst(stream: trio.SocketStream) -> None:
    """SO_LINGER 0: closing the socket sends an RST instead of a FIN."""
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
