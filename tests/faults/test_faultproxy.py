"""The fault proxy itself, against the real apiserver: pass-through keeps the client's TLS
identity, the terminating mode re-originates with it, and each scripted fault does what it
says."""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request

import pytest

from tests.faults.env import FaultEnv
from tests.support.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def node(fault_env: FaultEnv) -> None:
    fault_env.ensure_node()


def get(proxy: FaultProxy, env: FaultEnv, path: str, **kw: str) -> tuple[int, dict[str, str]]:
    ctx = env.apiserver.ssl_context(kw.get("identity", "node-a"))
    headers = {"Authorization": f"Bearer {kw['token']}"} if "token" in kw else {}
    if "token" in kw:
        ctx = env.apiserver.ssl_context(None)
    req = urllib.request.Request(proxy.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_identities_pass_through_both_modes(fault_env: FaultEnv) -> None:
    for proxy in (fault_env.passthrough, fault_env.terminating):
        # node-a may read its own Node (Node authorizer), not a secret: its identity arrived.
        assert get(proxy, fault_env, "/api/v1/nodes/node-a")[0] == 200
        assert get(proxy, fault_env, "/api/v1/namespaces/default/secrets")[0] == 403
    token = fault_env.apiserver.token("token-a")
    assert get(fault_env.terminating, fault_env, "/api/v1/namespaces", token=token)[0] == 200
    seen = [r for r in fault_env.terminating.requests if r.path == "/api/v1/nodes/node-a"]
    assert seen[-1].identity == "node-a" and seen[-1].status == 200 and not seen[-1].injected


def test_scripted_http_faults(fault_env: FaultEnv) -> None:
    proxy = fault_env.terminating
    try:
        proxy.respond(429, 2, retry_after=3, match="/api/v1/nodes")
        for _ in range(2):
            status, headers = get(proxy, fault_env, "/api/v1/nodes/node-a")
            assert (status, headers.get("Retry-After")) == (429, "3")
        assert get(proxy, fault_env, "/api/v1/nodes/node-a")[0] == 200  # only n of them
        token = fault_env.apiserver.token("token-a")
        proxy.reject_token(token)
        assert get(proxy, fault_env, "/api/v1/namespaces", token=token)[0] == 401
        proxy.reset_mid_response(1, after=10, match="/api/v1/nodes")
        with pytest.raises((http.client.HTTPException, OSError)):  # cut after 10 bytes
            get(proxy, fault_env, "/api/v1/nodes/node-a")
    finally:
        proxy.clear()


def test_refuse_and_cut(fault_env: FaultEnv) -> None:
    proxy = fault_env.passthrough
    try:
        held = socket.create_connection(("127.0.0.1", proxy.port))
        proxy.refuse(True)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert proxy.cut_all() >= 1
        held.settimeout(5)
        assert held.recv(1) == b""  # FIN: the open connection was closed
        held.close()
        proxy.refuse(False)
        assert get(proxy, fault_env, "/api/v1/nodes/node-a")[0] == 200
    finally:
        proxy.clear()
