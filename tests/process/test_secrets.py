"""Secrets never leave the process: `nodeagent run` against the real kube-apiserver with a bearer
token, a client certificate and key, and an exec credential plugin (and with a wrong token, an
unreachable server and a failing exec plugin); everything it printed (stdout, stderr, at debug
level) and served (every ops path) is scanned for every secret of the harness."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.kube.kubeconfig import ClusterConfig, ExecConfig
from tests.process.conftest import NotifyListener, nodeagent_command
from tests.support.apiserver import ApiServer, free_ports

OPS_PATHS = (
    "/",
    "/healthz",
    "/readyz?verbose",
    "/readyz?format=json",
    "/metrics",
    "/v1/status",
    "/v1/plugins",
    "/v1/resourceslices",
    "/v1/cnr",
    "/v1/config",
)
WRONG_TOKEN = "wrong-token-0123456789abcdef0123456789abcdef"
# Printed by an exec plugin in an ExecCredential of the wrong apiVersion (refused).
REFUSED_EXEC_TOKEN = "refused-exec-token-fedcba9876543210fedcba98"


@dataclass
class Run:
    name: str
    output: str  # stdout + stderr + every ops answer


def pem_body_lines(pem: str) -> list[str]:
    return [
        line
        for line in pem.splitlines()
        if line and not line.startswith("-----") and len(line) >= 24
    ]


def harness_secrets(apiserver: ApiServer) -> dict[str, str]:
    """Every secret the harness gave the agent, in each form it could leak in."""
    secrets: dict[str, str] = {"wrong token": WRONG_TOKEN, "refused exec token": REFUSED_EXEC_TOKEN}
    for name in ("admin", "token-a", "token-b"):
        token = apiserver.token(name)
        secrets[f"token {name}"] = token
        secrets[f"token {name} (base64)"] = base64.b64encode(token.encode()).decode()
    _, key = apiserver.cert_files("node-a")
    pem = key.read_text()
    secrets["node-a key (base64 of the PEM)"] = base64.b64encode(pem.encode()).decode()[:64]
    for i, line in enumerate(pem_body_lines(pem)):
        secrets[f"node-a key PEM line {i}"] = line
    return secrets


def kubeconfig(path: Path, server: str, ca: Path, user: dict[str, object]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc))  # JSON is YAML too
    return path


def exec_plugin(
    path: Path, token: str, *, fail: bool = False, api_version: str = "v1"
) -> dict[str, object]:
    """A kubeconfig `users[].exec` entry running a script that prints an ExecCredential."""
    credential = json.dumps(
        {
            "apiVersion": f"client.authentication.k8s.io/{api_version}",
            "kind": "ExecCredential",
            "status": {"token": token},
        }
    )
    body = (
        "echo 'credential helper: cannot reach the vault' >&2; exit 1"
        if fail
        else f"cat <<'EOF'\n{credential}\nEOF"
    )
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(path),
            "interactionMode": "Never",
            "provideClusterInfo": True,
        }
    }


def fetch(address: str, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def wait_for_ops_addresses(stderr: Path, proc: subprocess.Popen[str]) -> dict[str, str]:
    """{listener: address} from the "ops endpoint listening" log lines (main and public)."""
    deadline = time.monotonic() + 30
    pattern = re.compile(r"ops endpoint listening.* listener=(\w+) address=(\S+)")
    while len(found := dict(pattern.findall(stderr.read_text()))) < 2:
        assert proc.poll() is None, stderr.read_text()[-3000:]
        assert time.monotonic() < deadline, "the ops endpoint never listened"
        time.sleep(0.1)
    return found


def run_agent(tmp_path: Path, name: str, config: Path, expect: str) -> Run:
    """Start the agent with `config` at debug level, wait for `expect` in /readyz?verbose,
    fetch every ops path, stop it and return everything it printed and served."""
    work = tmp_path / name
    work.mkdir()
    notify = NotifyListener(work / "notify")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["NOTIFY_SOCKET"] = notify.path
    command = nodeagent_command(
        "run",
        "--state-dir",
        str(work / "state"),
        "--ops-address",
        "127.0.0.1:0",
        "--node-name",
        "node-a",
        "--kubeconfig",
        str(config),
        "--log-level",
        "debug",
        "--set",
        "agent.cluster_probe_interval=0.5",
        "--set",
        "kube.max_attempts=2",
        "--set",
        "kube.request_timeout=2",
        "--set",
        'ops.public_address="127.0.0.1:0"',
    )
    with (work / "stdout").open("w") as out, (work / "stderr").open("w") as err:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
    try:
        # Not READY=1: with credentials the apiserver refuses, start-up may not complete.
        addresses = wait_for_ops_addresses(work / "stderr", proc)
        address = addresses["main"]
        deadline = time.monotonic() + 30
        while expect not in (readyz := fetch(address, "/readyz?verbose")):
            assert time.monotonic() < deadline, f"{name}: no {expect!r} in /readyz: {readyz}"
            time.sleep(0.2)
        served = [
            f"== {name} {path}\n{fetch(where, path)}"
            for name, where in addresses.items()
            for path in OPS_PATHS
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
    printed = (work / "stdout").read_text() + (work / "stderr").read_text()
    return Run(name, printed + "\n".join(served))


@pytest.fixture(scope="module")
def runs(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Run]]:
    tmp = tmp_path_factory.mktemp("secrets")
    ca = apiserver.ca_file
    (closed_port,) = free_ports(1)
    server = apiserver.url
    crt, key = apiserver.cert_files("node-a")
    cases: list[tuple[str, dict[str, object], str, str]] = [
        (
            "bearer token",
            {"token": apiserver.token("token-a")},
            server,
            "[+]kube ok: connected",
        ),
        (
            "client certificate data",
            {
                "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
                "client-key-data": base64.b64encode(key.read_bytes()).decode(),
            },
            server,
            "[+]kube ok: connected",
        ),
        (
            "client certificate files",
            {"client-certificate": str(crt), "client-key": str(key)},
            server,
            "[+]kube ok: connected",
        ),
        (
            "exec plugin",
            exec_plugin(tmp / "exec-ok.sh", apiserver.token("token-b")),
            server,
            "[+]kube ok: connected",
        ),
        ("wrong token", {"token": WRONG_TOKEN}, server, "[-]kube not ready"),
        (
            "unreachable server",
            {"token": apiserver.token("admin")},
            f"https://127.0.0.1:{closed_port}",
            "[-]kube not ready",
        ),
        (
            "exec plugin answering the wrong apiVersion",
            exec_plugin(tmp / "exec-bad.sh", REFUSED_EXEC_TOKEN, api_version="v1beta1"),
            server,
            "[-]kube not ready",
        ),
        (
            "failing exec plugin",
            exec_plugin(tmp / "exec-fail.sh", apiserver.token("admin"), fail=True),
            server,
            "[-]kube not ready",
        ),
    ]
    out = []
    for i, (name, user, url, expect) in enumerate(cases):
        config = kubeconfig(tmp / f"kubeconfig-{i}", url, ca, user)
        out.append(run_agent(tmp, f"run-{i}", config, expect))
        out[-1].name = name
    yield out


def test_no_secret_in_anything_printed_or_served(apiserver: ApiServer, runs: list[Run]) -> None:
    secrets = harness_secrets(apiserver)
    leaks = [
        f"{run.name}: {label}"
        for run in runs
        for label, secret in secrets.items()
        if secret in run.output
    ]
    assert not leaks, leaks
    # The scan saw what it should: each run served its views and logged at debug level.
    for run in runs:
        assert '"ops"' in run.output and "nodeagent_build_info" in run.output, run.name


def test_failures_are_reported_without_the_secret(runs: list[Run]) -> None:
    by_name = {run.name: run.output for run in runs}
    assert "401" in by_name["wrong token"] or "Unauthorized" in by_name["wrong token"]
    assert "ConnectError" in by_name["unreachable server"]
    assert (
        "want client.authentication.k8s.io/v1/ExecCredential"
        in (by_name["exec plugin answering the wrong apiVersion"])
    )
    assert "cannot reach the vault" in by_name["failing exec plugin"]


def test_credentials_are_left_out_of_the_loaded_config_repr() -> None:
    # A repr in a log line, a traceback or a debugger must not carry the credentials.
    config = ClusterConfig(
        server="https://apiserver",
        token="repr-token-secret",
        client_key_data=b"repr-key-secret",
        exec=ExecConfig(command="helper", api_version="v1", env=(("VAULT", "repr-env-secret"),)),
    )
    text = repr(config)
    assert "https://apiserver" in text and "helper" in text
    for secret in ("repr-token-secret", "repr-key-secret", "repr-env-secret"):
        assert secret not in text
