"""The HTTP side of the client: one httpx client per TLS identity, rate limiting, auth
refresh on 401, bounded retries, per-request timeouts and the error mapping."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import msgspec
import trio

from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.kube import errors
from nodeagent.kube.auth import TlsSource, TokenSource, token_source
from nodeagent.kube.encoding import ACCEPT_ENCODING, BodyDecoder
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.metrics import (
    API_LATENCY,
    API_REQUESTS,
    API_RETRIES,
    AUTH_REFRESHES,
    BODIES_TOO_LARGE,
    RATE_LIMIT_WAIT,
)
from nodeagent.kube.ratelimit import TokenBucket
from nodeagent.log import get_logger

log = get_logger(__name__)

_JSON = "application/json"
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class _Http:
    """One httpx client (one TLS identity) and the requests still using it."""

    def __init__(self, client: httpx.AsyncClient, fingerprint: tuple[object, ...] | None) -> None:
        self.client = client
        self.fingerprint = fingerprint
        self.users = 0
        self.retired = False


class Transport:
    """Sends API requests: what a `KubeClient` sends through (it adds the typed verbs; see it
    for the parameters)."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        qps: float,
        burst: int,
        request_timeout: float,
        connect_timeout: float,
        max_attempts: int,
        retry_backoff: tuple[float, float],
        max_retry_after: float,
        token_reread_interval: float,
        exec_skew: float,
        rng: random.Random,
        transport: httpx.AsyncBaseTransport | None,
        max_response_bytes: int | None = None,
    ) -> None:
        self.config = config
        # The most a response body may decode to (kube.max_response_bytes; None: unbounded).
        self.max_response_bytes = max_response_bytes
        self._transport = transport  # tests inject faults here; None: real connections
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.max_attempts = max(1, max_attempts)
        self.retry_backoff = retry_backoff
        self.max_retry_after = max_retry_after
        self.rng = rng
        self.limiter = TokenBucket(qps, burst)
        self.tokens: TokenSource | None = token_source(
            config, reread_interval=token_reread_interval, exec_skew=exec_skew
        )
        self._tls = TlsSource(config) if config.server.startswith("https://") else None
        self._extensions: dict[str, Any] = (
            {"sni_hostname": config.tls_server_name} if config.tls_server_name else {}
        )
        self._http: _Http | None = None
        self._retired: set[_Http] = set()
        self._closed = False
        # A dry run: every request but a read carries dryRun=All, so nothing sent through this
        # transport can persist (the raw `request` callers' writes included).
        self.dry_run = False

    def open(self) -> None:
        self._http = self._new_http()

    async def aclose(self) -> None:
        self._closed = True
        with trio.CancelScope(shield=True):
            for http in [*self._retired, *([self._http] if self._http else [])]:
                await http.client.aclose()
        self._retired.clear()
        self._http = None

    def _new_http(self) -> _Http:
        fingerprint = None
        verify: Any = True
        if self._tls is not None:
            fingerprint = self._tls.fingerprint()
            verify = self._tls.build()
        client = httpx.AsyncClient(
            base_url=self.config.server,
            verify=verify,
            timeout=httpx.Timeout(self.request_timeout, connect=self.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
            # Bodies are decoded by `encoding.BodyDecoder` (httpx's gzip decoder reads only the
            # first member), so advertise exactly what it decodes.
            headers={
                "Accept": _JSON,
                "Accept-Encoding": ACCEPT_ENCODING,
                # A dry run's requests are told apart in the audit log by their user agent.
                "User-Agent": "nodeagent (dry-run)" if self.dry_run else "nodeagent",
            },
            trust_env=False,
            transport=self._transport,
        )
        return _Http(client, fingerprint)

    def _current_http(self) -> _Http:
        if self._http is None or self._closed:
            raise RuntimeError("KubeClient used outside `async with`")
        if self._tls is not None:
            fingerprint = self._tls.fingerprint()
            if fingerprint is not None and fingerprint != self._http.fingerprint:
                try:
                    fresh = self._new_http()
                except (OSError, ValueError) as exc:
                    # A cert rewritten before its key: keep the old identity, retry next request.
                    log.warning("client certificate reload failed", error=str(exc))
                else:
                    AUTH_REFRESHES.labels("client_cert").inc()
                    log.info("client certificate files changed: new TLS identity")
                    old, self._http = self._http, fresh
                    old.retired = True
                    self._retired.add(old)
        return self._http

    async def _release(self, http: _Http) -> None:
        http.users -= 1
        if http.retired and http.users == 0 and http in self._retired:
            self._retired.discard(http)
            with trio.CancelScope(shield=True):
                await http.client.aclose()

    async def _headers(self) -> dict[str, str]:
        if self.tokens is None:
            return {}
        return {"Authorization": f"Bearer {await self.tokens.token()}"}

    async def _attempt(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        verb: str,
        resource: str,
    ) -> tuple[int, httpx.Headers, bytes]:
        RATE_LIMIT_WAIT.observe(await self.limiter.acquire())
        headers = await self._headers()
        if content_type:
            headers["Content-Type"] = content_type
        http = self._current_http()
        http.users += 1
        start = time.perf_counter()
        try:
            with trio.fail_after(self.request_timeout):
                request = http.client.build_request(
                    method,
                    path,
                    params=params,
                    content=body,
                    headers=headers,
                    extensions=self._extensions,
                )
                resp = await http.client.send(request, stream=True)
                try:
                    data = await read_body(resp, max_bytes=self.max_response_bytes)
                finally:
                    with trio.CancelScope(shield=True):
                        await resp.aclose()
        except trio.TooSlowError:
            API_REQUESTS.labels(verb, resource, "error").inc()
            raise errors.TransportError(
                f"{method} {path}: no answer within {self.request_timeout}s", sent=True
            ) from None
        except httpx.TransportError as exc:
            API_REQUESTS.labels(verb, resource, "error").inc()
            raise _transport_error(method, path, exc) from exc
        except errors.BodyTooLarge as exc:
            API_REQUESTS.labels(verb, resource, str(resp.status_code)).inc()
            BODIES_TOO_LARGE.labels(resource, exc.limit).inc()
            log.error("response body too large", verb=verb, path=path, error=exc.message)
            raise errors.BodyTooLarge(f"{method} {path}: {exc.message}", limit=exc.limit) from None
        except errors.DecodeError as exc:
            API_REQUESTS.labels(verb, resource, str(resp.status_code)).inc()
            log.error("response body not decodable", verb=verb, path=path, error=str(exc))
            raise errors.DecodeError(f"{method} {path}: {exc}") from None
        finally:
            await self._release(http)
        API_LATENCY.labels(verb, resource).observe(time.perf_counter() - start)
        API_REQUESTS.labels(verb, resource, str(resp.status_code)).inc()
        return resp.status_code, resp.headers, data

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        verb: str = "",
        resource: str = "",
        idempotent: bool = True,
    ) -> bytes:
        """One API call with rate limiting, auth refresh on 401 and bounded retries.

        A non-idempotent call is retried only when it provably never reached the server (a
        connect failure) or on 429; an idempotent one also on other transport errors, 500,
        503, 504 and server timeouts.
        """
        verb = verb or method.lower()
        if self.dry_run and method not in _READS:
            params = {**(params or {}), "dryRun": "All"}
            if method == "DELETE" and body:
                # A DELETE with a body takes its options from the body alone: the apiserver
                # then ignores the query's dryRun (and would delete for real).
                body = _dry_run_delete_options(body)
        # Up to half below each step: clients that failed together do not retry together.
        backoff = Backoff(*self.retry_backoff, jitter=Jitter.below(0.5), random=self.rng.random)
        reauthenticated = False
        attempt = 0
        while True:
            attempt += 1
            try:
                code, headers, data = await self._attempt(
                    method, path, params, body, content_type, verb, resource
                )
            except errors.TransportError as exc:
                if (exc.sent and not idempotent) or attempt >= self.max_attempts:
                    raise
                delay = backoff.next()
                API_RETRIES.labels(verb, resource, "transport").inc()
                log.debug("retrying", verb=verb, path=path, error=exc.message, delay=delay)
                await trio.sleep(delay)
                continue
            except errors.BodyTooLarge:
                raise  # the same answer would decode as large again
            except errors.DecodeError:
                # The answer came but could not be read whole: like a broken connection.
                if not idempotent or attempt >= self.max_attempts:
                    raise
                delay = backoff.next()
                API_RETRIES.labels(verb, resource, "decode").inc()
                await trio.sleep(delay)
                continue
            if code < 400:
                return data
            err = errors.error_from_response(code, data, headers)
            if isinstance(err, errors.Unauthorized) and self.tokens and not reauthenticated:
                # A rotated token or an expired exec credential: fetch a fresh one, once.
                reauthenticated = True
                self.tokens.invalidate()
                attempt -= 1
                continue
            if attempt >= self.max_attempts or not _retryable(err, idempotent):
                raise err
            if err.retry_after is not None:
                delay = min(err.retry_after, self.max_retry_after)
            else:
                delay = backoff.next()
            API_RETRIES.labels(verb, resource, str(code)).inc()
            log.debug("retrying", verb=verb, path=path, code=code, delay=delay)
            await trio.sleep(delay)

    def stream(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        read_timeout: float,
        verb: str = "watch",
        resource: str = "",
    ) -> AbstractAsyncContextManager[httpx.Response]:
        """A streaming GET (one attempt; the watch loop owns retries). ``read_timeout`` bounds
        the wait for each chunk, so a silently dead stream raises `TransportError`."""
        # The plain context-manager type, so that subclasses (tests) may wrap the stream.
        return self._stream(path, params, read_timeout, verb, resource)

    @asynccontextmanager
    async def _stream(
        self, path: str, params: Mapping[str, str], read_timeout: float, verb: str, resource: str
    ) -> AsyncIterator[httpx.Response]:
        reauthenticated = False
        while True:
            RATE_LIMIT_WAIT.observe(await self.limiter.acquire())
            headers = await self._headers()
            http = self._current_http()
            http.users += 1
            try:
                request = http.client.build_request(
                    "GET",
                    path,
                    params=params,
                    headers=headers,
                    timeout=httpx.Timeout(
                        self.request_timeout, connect=self.connect_timeout, read=read_timeout
                    ),
                    extensions=self._extensions,
                )
                start = time.perf_counter()
                try:
                    resp = await http.client.send(request, stream=True)
                except httpx.TransportError as exc:
                    API_REQUESTS.labels(verb, resource, "error").inc()
                    raise _transport_error("GET", path, exc) from exc
                API_LATENCY.labels(verb, resource).observe(time.perf_counter() - start)
                API_REQUESTS.labels(verb, resource, str(resp.status_code)).inc()
                try:
                    if resp.status_code >= 400:
                        try:
                            data = await read_body(resp, max_bytes=self.max_response_bytes)
                        except httpx.TransportError as exc:
                            raise _transport_error("GET", path, exc) from exc
                        err = errors.error_from_response(resp.status_code, data, resp.headers)
                        if (
                            isinstance(err, errors.Unauthorized)
                            and self.tokens
                            and not reauthenticated
                        ):
                            reauthenticated = True
                            self.tokens.invalidate()
                            continue
                        raise err
                    yield resp
                    return
                finally:
                    with trio.CancelScope(shield=True):
                        await resp.aclose()
            finally:
                await self._release(http)


def body_stream(
    resp: httpx.Response, *, max_bytes: int | None = None, max_line: int | None = None
) -> tuple[BodyDecoder, AsyncIterator[bytes]]:
    """A response's body as received and the decoder for it (with its limits: see
    `BodyDecoder`): the raw bytes of a streamed response go through `BodyDecoder`, never
    through httpx's decoders."""
    if resp.is_stream_consumed:
        # Built in memory (a mock transport's answer): httpx read and decoded it already.
        return BodyDecoder(None, max_bytes=max_bytes, max_line=max_line), resp.aiter_bytes()
    decoder = BodyDecoder(
        resp.headers.get("content-encoding"), max_bytes=max_bytes, max_line=max_line
    )
    return decoder, resp.aiter_raw()


async def read_body(resp: httpx.Response, *, max_bytes: int | None = None) -> bytes:
    """A (streamed) response's whole body, decoded by `BodyDecoder` (`DecodeError` if any of
    it could not be, `BodyTooLarge` past ``max_bytes``)."""
    decoder, chunks = body_stream(resp, max_bytes=max_bytes)
    parts = [piece async for raw in chunks for piece in decoder.pieces(raw)]
    decoder.finish()
    return b"".join(parts)


def _dry_run_delete_options(body: bytes) -> bytes:
    try:
        options = msgspec.json.decode(body)
    except msgspec.DecodeError:
        options = None
    if not isinstance(options, dict):
        raise ValueError("dry run: a DELETE body must be DeleteOptions (a JSON object)")
    options["dryRun"] = ["All"]
    return msgspec.json.encode(options)


def _retryable(err: errors.ApiError, idempotent: bool) -> bool:
    if isinstance(err, errors.TooManyRequests):
        return True
    if not idempotent:
        return False
    return isinstance(
        err, errors.InternalError | errors.ServiceUnavailable | errors.ServerTimeout
    ) or err.code in (502, 503, 504)


def _transport_error(method: str, path: str, exc: httpx.TransportError) -> errors.TransportError:
    # Connect-phase failures (DNS, refused, TLS handshake, pool) never reached the server.
    sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    what = type(exc).__name__
    return errors.TransportError(f"{method} {path}: {what}: {exc}", sent=sent)
