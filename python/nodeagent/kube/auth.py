"""Credentials that change under a long-running agent: token files (bound service account
tokens are rewritten about hourly), exec plugins (tokens with an expiry) and client certificate
files (the kubelet's rotating ``kubelet-client-current.pem`` symlink)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol

import msgspec
import trio

from nodeagent.kube.errors import CredentialError
from nodeagent.kube.kubeconfig import ClusterConfig, ExecConfig
from nodeagent.kube.metrics import AUTH_REFRESHES
from nodeagent.log import get_logger

log = get_logger(__name__)


class TokenSource(Protocol):
    async def token(self) -> str: ...

    def invalidate(self) -> None:
        """The server answered 401: fetch a fresh token next time."""


class StaticToken:
    def __init__(self, token: str) -> None:
        self._token = token

    async def token(self) -> str:
        return self._token

    def invalidate(self) -> None:
        pass


class FileToken:
    """A token file re-read every ``reread_interval`` seconds and after a 401."""

    def __init__(self, path: str, reread_interval: float = 60.0) -> None:
        self.path = path
        self.reread_interval = reread_interval
        self._token: str | None = None
        self._read_at = float("-inf")

    async def token(self) -> str:
        now = trio.current_time()
        if self._token is None or now - self._read_at >= self.reread_interval:
            try:
                text = (await trio.Path(self.path).read_text()).strip()
            except OSError as exc:
                if self._token is None:
                    raise CredentialError(f"token file {self.path}: {exc.strerror}") from None
                # Mid-rotation the file can briefly vanish: keep the last good token.
                log.warning("token file unreadable", path=self.path, error=str(exc))
                return self._token
            if not text:
                if self._token is None:
                    raise CredentialError(f"token file {self.path} is empty")
                return self._token
            if text != self._token and self._token is not None:
                AUTH_REFRESHES.labels("token_file").inc()
            self._token = text
            self._read_at = now
        return self._token

    def invalidate(self) -> None:
        self._read_at = float("-inf")


class _ExecStatus(msgspec.Struct, kw_only=True):
    token: str | None = None
    expiration_timestamp: str | None = msgspec.field(default=None, name="expirationTimestamp")
    client_certificate_data: str | None = msgspec.field(default=None, name="clientCertificateData")


class _ExecCredential(msgspec.Struct, kw_only=True):
    api_version: str = msgspec.field(default="", name="apiVersion")
    kind: str = ""
    status: _ExecStatus | None = None


class ExecToken:
    """Runs an exec credential plugin; caches its token until ``expirationTimestamp - skew``
    (forever without one) and reruns it after a 401."""

    def __init__(
        self,
        cfg: ExecConfig,
        *,
        server: str,
        ca_data: bytes | None = None,
        insecure: bool = False,
        skew: float = 300.0,
        timeout: float = 60.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.skew = skew
        self.timeout = timeout
        self._wall = wall_clock
        self._server = server
        self._ca_data = ca_data
        self._insecure = insecure
        self._token: str | None = None
        self._expires: float | None = None
        self._lock = trio.Lock()
        self.runs = 0

    def _valid(self) -> bool:
        if self._token is None:
            return False
        return self._expires is None or self._wall() < self._expires - self.skew

    async def token(self) -> str:
        async with self._lock:  # one plugin run for many concurrent requests
            if not self._valid():
                await self._run()
            assert self._token is not None
            return self._token

    def invalidate(self) -> None:
        self._token = None

    def _exec_info(self) -> str:
        spec: dict[str, object] = {"interactive": False}
        if self.cfg.provide_cluster_info:
            cluster: dict[str, object] = {"server": self._server}
            if self._ca_data:
                cluster["certificate-authority-data"] = base64.b64encode(self._ca_data).decode()
            if self._insecure:
                cluster["insecure-skip-tls-verify"] = True
            spec["cluster"] = cluster
        return json.dumps(
            {"apiVersion": self.cfg.api_version, "kind": "ExecCredential", "spec": spec}
        )

    async def _run(self) -> None:
        env = dict(os.environ)
        env.update(self.cfg.env)
        env["KUBERNETES_EXEC_INFO"] = self._exec_info()
        argv = [self.cfg.command, *self.cfg.args]
        self.runs += 1
        try:
            with trio.fail_after(self.timeout):
                proc = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, env=env, check=False
                )
        except trio.TooSlowError:
            raise CredentialError(f"exec plugin {argv[0]}: no answer in {self.timeout}s") from None
        except OSError as exc:
            hint = f" ({self.cfg.install_hint})" if self.cfg.install_hint else ""
            raise CredentialError(f"exec plugin {argv[0]}: {exc.strerror}{hint}") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-500:]
            raise CredentialError(f"exec plugin {argv[0]} exited {proc.returncode}: {err}")
        try:
            cred = msgspec.json.decode(proc.stdout, type=_ExecCredential)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CredentialError(f"exec plugin {argv[0]}: bad ExecCredential: {exc}") from None
        if cred.kind != "ExecCredential" or cred.api_version != self.cfg.api_version:
            raise CredentialError(
                f"exec plugin {argv[0]}: got {cred.api_version or '?'}/{cred.kind or '?'}, "
                f"want {self.cfg.api_version}/ExecCredential"
            )
        status = cred.status
        if status is None or not status.token:
            what = (
                "client certificates are not supported"
                if status and status.client_certificate_data
                else "no status.token"
            )
            raise CredentialError(f"exec plugin {argv[0]}: {what}")
        expires = None
        if status.expiration_timestamp:
            try:
                expires = datetime.fromisoformat(status.expiration_timestamp).timestamp()
            except ValueError:
                raise CredentialError(
                    f"exec plugin {argv[0]}: bad expirationTimestamp "
                    f"{status.expiration_timestamp!r}"
                ) from None
        if self._token is not None:
            AUTH_REFRESHES.labels("exec").inc()
        self._token = status.token
        self._expires = expires


def token_source(
    cfg: ClusterConfig, *, reread_interval: float, exec_skew: float
) -> TokenSource | None:
    if cfg.exec is not None:
        return ExecToken(
            cfg.exec,
            server=cfg.server,
            ca_data=cfg.ca_data,
            insecure=cfg.insecure_skip_tls_verify,
            skew=exec_skew,
        )
    if cfg.token_file:
        return FileToken(cfg.token_file, reread_interval)
    if cfg.token:
        return StaticToken(cfg.token)
    return None


def _stat_key(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    st = os.stat(path)  # follows the symlink: a swapped link target changes inode and mtime
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class TlsSource:
    """Builds the SSLContext and tells when the files behind it changed."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg

    def fingerprint(self) -> tuple[object, ...] | None:
        """Identity of the certificate, key and CA files; None if one is missing right now."""
        try:
            return (
                _stat_key(self.cfg.client_cert_file),
                _stat_key(self.cfg.client_key_file),
                _stat_key(self.cfg.ca_file),
            )
        except OSError:
            return None

    def build(self) -> ssl.SSLContext:
        cfg = self.cfg
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if cfg.insecure_skip_tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif cfg.ca_data or cfg.ca_file:
            # The cluster CA only, like client-go: a public CA must not vouch for the apiserver.
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            if cfg.ca_file:
                ctx.load_verify_locations(cafile=cfg.ca_file)
            if cfg.ca_data:
                ctx.load_verify_locations(cadata=cfg.ca_data.decode("ascii", "replace"))
        if cfg.client_cert_file and cfg.client_key_file:
            ctx.load_cert_chain(cfg.client_cert_file, cfg.client_key_file)
        elif cfg.client_cert_data and cfg.client_key_data:
            _load_chain_data(ctx, cfg.client_cert_data, cfg.client_key_data)
        elif cfg.client_cert_file and cfg.client_key_data:
            with _tempfile(cfg.client_key_data) as key:
                ctx.load_cert_chain(cfg.client_cert_file, key)
        elif cfg.client_cert_data and cfg.client_key_file:
            with _tempfile(cfg.client_cert_data) as cert:
                ctx.load_cert_chain(cert, cfg.client_key_file)
        return ctx


@contextlib.contextmanager
def _tempfile(data: bytes) -> Iterator[str]:
    # ssl can load a chain only from files; keep the key on disk for as short as possible.
    fd, name = tempfile.mkstemp(prefix="nodeagent-tls-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield name
    finally:
        Path(name).unlink(missing_ok=True)


def _load_chain_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    with _tempfile(cert) as c, _tempfile(key) as k:
        ctx.load_cert_chain(c, k)
