"""Exec credential plugins and TLS material, without a server."""

from __future__ import annotations

import json
import ssl
import sys
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from nodeagent.kube import NODES, KubeClient, errors
from nodeagent.kube.auth import ExecToken, TlsSource
from nodeagent.kube.kubeconfig import ClusterConfig, ExecConfig

V1 = "client.authentication.k8s.io/v1"


def _plugin(tmp_path: Path, output: str, code: int = 0) -> ExecConfig:
    script = tmp_path / "plugin.py"
    script.write_text(
        "import sys\n"
        "open(sys.argv[1], 'a').write('run\\n')\n"
        f"sys.stdout.write({output!r})\n"
        "sys.stderr.write('plugin says hi')\n"
        f"sys.exit({code})\n"
    )
    return ExecConfig(
        command=sys.executable, api_version=V1, args=(str(script), str(tmp_path / "runs"))
    )


def _cred(token: str | None = "t", expiry: str | None = None, api: str = V1) -> str:
    status: dict[str, str] = {}
    if token:
        status["token"] = token
    if expiry:
        status["expirationTimestamp"] = expiry
    return json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status})


def _runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines())


async def test_exec_token_cached_without_expiry_and_rerun_after_invalidate(tmp_path: Path) -> None:
    source = ExecToken(_plugin(tmp_path, _cred("tok")), server="https://k")
    assert [await source.token() for _ in range(3)] == ["tok"] * 3
    assert _runs(tmp_path) == 1
    source.invalidate()
    assert await source.token() == "tok"
    assert _runs(tmp_path) == 2


async def test_exec_token_respects_expiry_minus_skew(tmp_path: Path) -> None:
    cfg = _plugin(tmp_path, _cred("tok", "2027-01-15T08:00:00Z"))
    expiry = datetime.fromisoformat("2027-01-15T08:00:00+00:00").timestamp()
    clock = [expiry - 301]  # the wall clock is injected: real time never matters here
    source = ExecToken(cfg, server="https://k", skew=300, wall_clock=lambda: clock[0])
    await source.token()
    await source.token()
    assert _runs(tmp_path) == 1
    clock[0] = expiry - 299  # inside the skew: fetch a new one
    await source.token()
    assert _runs(tmp_path) == 2


async def test_concurrent_requests_run_the_plugin_once(tmp_path: Path) -> None:
    source = ExecToken(_plugin(tmp_path, _cred("tok")), server="https://k")
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(source.token)
    assert _runs(tmp_path) == 1


@pytest.mark.parametrize(
    ("output", "code", "match"),
    [
        ("", 3, "exited 3: plugin says hi"),
        ("not json", 0, "bad ExecCredential"),
        (_cred(api="client.authentication.k8s.io/v1beta1"), 0, "want client.authentication"),
        (_cred(token=None), 0, "no status.token"),
        (_cred(expiry="yesterday"), 0, "bad expirationTimestamp"),
    ],
)
async def test_exec_failures_are_credential_errors(
    tmp_path: Path, output: str, code: int, match: str
) -> None:
    source = ExecToken(_plugin(tmp_path, output, code), server="https://k")
    with pytest.raises(errors.CredentialError, match=match):
        await source.token()


async def test_missing_exec_command_mentions_install_hint() -> None:
    cfg = ExecConfig(
        command="/nonexistent/kubelogin", api_version=V1, install_hint="install kubelogin"
    )
    with pytest.raises(errors.CredentialError, match="install kubelogin"):
        await ExecToken(cfg, server="https://k").token()


async def test_exec_timeout(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time; time.sleep(30)")
    cfg = ExecConfig(command=sys.executable, api_version=V1, args=(str(script),))
    with pytest.raises(errors.CredentialError, match="no answer"):
        await ExecToken(cfg, server="https://k", timeout=0.5).token()


def test_tls_insecure_only_when_set() -> None:
    secure = TlsSource(ClusterConfig(server="https://k")).build()
    assert secure.verify_mode == ssl.CERT_REQUIRED and secure.check_hostname
    insecure = TlsSource(ClusterConfig(server="https://k", insecure_skip_tls_verify=True)).build()
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname


def test_tls_fingerprint_follows_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pem", tmp_path / "b.pem"
    a.write_text("a")
    b.write_text("bb")
    link = tmp_path / "current.pem"
    link.symlink_to(a)
    source = TlsSource(
        ClusterConfig(server="https://k", client_cert_file=str(link), client_key_file=str(link))
    )
    first = source.fingerprint()
    assert first is not None and first == source.fingerprint()
    link.unlink()
    assert source.fingerprint() is None  # mid-swap: no decision, keep the old context
    link.symlink_to(b)
    assert source.fingerprint() not in (None, first)


async def test_client_uses_tls_server_name(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[dict[str, object]] = []

    async def server(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions))
        return httpx.Response(200, json={})

    cfg = ClusterConfig(server="https://10.0.0.1", tls_server_name="api.internal")
    async with KubeClient(cfg, transport=httpx.MockTransport(server)) as client:
        await client.get(NODES, "n")
    assert seen[0]["sni_hostname"] == "api.internal"
