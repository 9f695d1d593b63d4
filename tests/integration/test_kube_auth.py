"""Authentication against the real apiserver: tokens, client certs, exec plugins, rotation."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from nodeagent.kube import NAMESPACES, KubeClient, load_kubeconfig
from nodeagent.kube.auth import ExecToken
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer

pytestmark = pytest.mark.integration

REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def whoami(client: KubeClient) -> str:
    data = await client.request(
        "POST", REVIEWS, body=json.dumps(REVIEW).encode(), content_type="application/json"
    )
    return str(json.loads(data)["status"]["userInfo"]["username"])


def _kubeconfig(apiserver: ApiServer, path: Path, user: dict[str, Any]) -> Path:
    return apiserver.write_kubeconfig(path, user)


async def test_bearer_token_and_client_cert_identities(apiserver: ApiServer) -> None:
    async with client_for(apiserver, "token") as client:
        assert await whoami(client) == "token-user"
    async with client_for(apiserver, "node-a") as client:
        assert await whoami(client) == "system:node:node-a"
    async with client_for(apiserver, "admin") as client:
        assert await client.get(NAMESPACES, "default")


async def _until(check: Callable[[], Any], want: str, limit: float = 30) -> None:
    with trio.fail_after(limit):  # a real server and real files: poll with a deadline
        while await check() != want:  # noqa: ASYNC110 - nothing to wait on but the server
            await trio.sleep(0.1)


async def test_token_file_rotation_is_followed(apiserver: ApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(apiserver.token("admin") + "\n")
    cfg = _kubeconfig(apiserver, tmp_path / "kubeconfig", {"tokenFile": str(token_file)})
    # The interval runs from the read at the start of the first call: that call (a new TLS
    # connection) and the rotation must fit in it for the second call to use the old token,
    # which 2 s left little margin for on a loaded machine.
    async with KubeClient(load_kubeconfig(str(cfg)), token_reread_interval=5.0) as client:
        assert await whoami(client) == "admin-token"
        tmp = tmp_path / "token.new"  # rotate atomically, as the kubelet does
        tmp.write_text(apiserver.token("token-b"))
        os.replace(tmp, token_file)
        assert await whoami(client) == "admin-token"  # read at most every 5 s, not per call
        await _until(lambda: whoami(client), "token-user")


def _combined_pem(apiserver: ApiServer, identity: str, dest: Path) -> Path:
    crt, key = apiserver.cert_files(identity)
    dest.write_bytes(crt.read_bytes() + key.read_bytes())
    return dest


async def test_client_cert_rotation_behind_symlink(apiserver: ApiServer, tmp_path: Path) -> None:
    # Like the kubelet: one PEM with cert and key, "current" a symlink to the newest one.
    a = _combined_pem(apiserver, "node-a", tmp_path / "client-a.pem")
    b = _combined_pem(apiserver, "node-b", tmp_path / "client-b.pem")
    current = tmp_path / "client-current.pem"
    current.symlink_to(a)
    user = {"client-certificate": str(current), "client-key": str(current)}
    cfg = _kubeconfig(apiserver, tmp_path / "kubeconfig", user)
    async with KubeClient(load_kubeconfig(str(cfg))) as client:
        assert await whoami(client) == "system:node:node-a"
        link = tmp_path / "client-current.tmp"
        link.symlink_to(b)
        os.replace(link, current)
        assert await whoami(client) == "system:node:node-b"


EXEC_PLUGIN = """
import json, os, sys
state = sys.argv[1]
runs_file = os.path.join(state, "runs")
runs = int(open(runs_file).read()) if os.path.exists(runs_file) else 0
open(runs_file, "w").write(str(runs + 1))
open(os.path.join(state, "exec-info-%d" % runs), "w").write(os.environ["KUBERNETES_EXEC_INFO"])
token, expiry = json.load(open(os.path.join(state, "plan")))[runs]
print(json.dumps({
    "apiVersion": os.environ["API_VERSION"],
    "kind": "ExecCredential",
    "status": {"token": token, "expirationTimestamp": expiry},
}))
"""


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
async def test_exec_plugin_cached_until_expiry_and_rerun_on_401(
    apiserver: ApiServer, tmp_path: Path, api_version: str
) -> None:
    script = tmp_path / "plugin.py"
    script.write_text(EXEC_PLUGIN)

    def at(delta: timedelta) -> str:
        return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")

    plan = [
        ["revoked-token", at(timedelta(hours=1))],  # the server rejects it: rerun
        [apiserver.token("admin"), at(timedelta(minutes=2))],  # inside the 5 min skew: rerun
        [apiserver.token("token-b"), at(timedelta(hours=1))],  # cached from then on
    ]
    (tmp_path / "plan").write_text(json.dumps(plan))
    user = {
        "exec": {
            "apiVersion": api_version,
            "command": sys.executable,
            "args": [str(script), str(tmp_path)],
            "env": [{"name": "API_VERSION", "value": api_version}],
            "provideClusterInfo": True,
        }
    }
    cfg = _kubeconfig(apiserver, tmp_path / "kubeconfig", user)
    async with KubeClient(load_kubeconfig(str(cfg))) as client:
        assert await whoami(client) == "admin-token"
        assert (tmp_path / "runs").read_text() == "2"
        assert await whoami(client) == "token-user"
        assert await whoami(client) == "token-user"
        assert await whoami(client) == "token-user"
        assert isinstance(client.tokens, ExecToken)
        assert client.tokens.runs == 3
    assert (tmp_path / "runs").read_text() == "3"
    info = json.loads((tmp_path / "exec-info-0").read_text())
    assert info["apiVersion"] == api_version and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == apiserver.url
