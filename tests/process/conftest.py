"""Helpers to run `python -m nodeagent run` as a real subprocess with a test notify socket."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodeagent.kube import CORE_EVENTS, CUSTOMRESOURCEDEFINITIONS, NODES, RESOURCESLICES
from tests.support.apiserver import DEFAULT_NODES, ApiServer, start_apiserver
from tests.support.crds import CNR, CNR_CRD_NAME
from tests.support.wait import NotYet, until

START_TIMEOUT = 30.0


@pytest.fixture(scope="session")
def shared_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """One kube-apiserver for every module here that needs no server of its own (one it stops,
    restarts or starts with other flags, nodes or audit policy keeps its own): a start and a
    stop saved per module."""
    with start_apiserver(tmp_path_factory.mktemp("process-apiserver")) as srv:
        yield srv


def _reset(srv: ApiServer) -> None:
    """What the sharing modules make on a cluster, deleted: every ResourceSlice and Event, the
    CNRs and their CRD, the Nodes of the harness's identities. The cluster is then the one a new
    server has for node-a and node-b (RBAC objects, the same in every module, may stay)."""
    status, namespaces = srv.request("GET", "/api/v1/namespaces")
    assert status == 200, namespaces
    paths = [RESOURCESLICES.path(), CNR.path()]
    # Tests count Events by reason cluster-wide (a conflict another module provoked is not theirs).
    paths += [CORE_EVENTS.path(ns["metadata"]["name"]) for ns in namespaces["items"]]
    paths += [NODES.path(None, node) for node in DEFAULT_NODES]
    paths.append(CUSTOMRESOURCEDEFINITIONS.path(None, CNR_CRD_NAME))
    for path in paths:
        status, body = srv.request("DELETE", path)
        assert status in (200, 202, 404), (path, status, body)

    def gone() -> bool | NotYet:
        # The CRD is deleted after its objects (Terminating first): a module starting meanwhile
        # would see the kind still served.
        status, body = srv.request("GET", CUSTOMRESOURCEDEFINITIONS.path(None, CNR_CRD_NAME))
        return status == 404 or NotYet((status, body))

    until(gone, f"the CRD {CNR_CRD_NAME} deleted")


@pytest.fixture(scope="module")
def apiserver(shared_apiserver: ApiServer) -> Iterator[ApiServer]:
    """The shared kube-apiserver, with what the module before made deleted before and after
    this module (a module defining its own ``apiserver`` fixture overrides this one)."""
    _reset(shared_apiserver)
    yield shared_apiserver
    _reset(shared_apiserver)


class NotifyListener:
    """The systemd side of sd_notify: a datagram socket that collects every message."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def _receive(self, timeout: float) -> bool:
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
        self.messages.append((time.monotonic(), fields))
        return True

    def wait_for(
        self, key: str, value: str = "1", timeout: float = START_TIMEOUT, *, new: bool = False
    ) -> dict[str, str]:
        """The first message (already seen, unless `new`, or new) with key=value; fails after
        `timeout`."""
        for _, fields in [] if new else self.messages:
            if fields.get(key) == value:
                return fields
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._receive(left) and self.messages[-1][1].get(key) == value:
                return self.messages[-1][1]
        raise AssertionError(f"no {key}={value} within {timeout}s; got {self.messages}")

    def drain(self) -> list[tuple[float, dict[str, str]]]:
        """Everything already queued on the socket (sent before now), without waiting."""
        start = len(self.messages)
        while self._receive(0.001):
            pass
        return self.messages[start:]

    def collect(self, seconds: float) -> list[tuple[float, dict[str, str]]]:
        """Everything received during the next `seconds`."""
        start = len(self.messages)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._receive(left)
        return self.messages[start:]

    def close(self) -> None:
        self.sock.close()


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    notify: NotifyListener
    state_dir: Path
    ops_address: str = ""
    stderr_text: str = field(default="")

    def wait_ready(self) -> dict[str, str]:
        fields = self.notify.wait_for("READY")
        match = re.search(r"ops on (\S+)", fields.get("STATUS", ""))
        assert match, fields
        self.ops_address = match.group(1)
        return fields

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        url = f"http://{self.ops_address}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stderr is not None
        self.stderr_text = self.proc.stderr.read()
        return self.proc.returncode


StartAgent = Callable[..., AgentProcess]


def nodeagent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodeagent", *args]


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[StartAgent]:
    started: list[AgentProcess] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        watchdog_usec: int | None = None,
        config: str | None = None,
        launcher: str = "nodeagent",
        wrapper: Sequence[str] = (),
    ) -> AgentProcess:
        index = len(started)
        notify = NotifyListener(tmp_path / f"notify-{index}")
        state_dir = tmp_path / f"state-{index}"
        full_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))
        }
        full_env.pop("KUBERNETES_SERVICE_HOST", None)
        full_env["NOTIFY_SOCKET"] = notify.path
        if watchdog_usec is not None:
            full_env["WATCHDOG_USEC"] = str(watchdog_usec)
        full_env.update(env or {})
        command: Sequence[str] = [
            # e.g. unshare: a wrapper that ends by exec'ing the agent (the pid stays the agent's)
            *wrapper,
            sys.executable,
            "-m",
            launcher,  # tests.support.unready_agent: the command with a test-only component
            "run",
            "--state-dir",
            str(state_dir),
            "--ops-address",
            "127.0.0.1:0",
            *args,
        ]
        if config is not None:
            path = tmp_path / f"config-{index}.toml"
            path.write_text(config)
            command = [*command, "--config", str(path)]
        proc = subprocess.Popen(
            command, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        agent = AgentProcess(proc, notify, state_dir)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait()
        if agent.proc.stderr is not None:
            agent.proc.stderr.close()
        agent.notify.close()
