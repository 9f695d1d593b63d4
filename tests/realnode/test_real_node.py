"""The real-node smoke test (docs/testing/real-node.md): the harness's kube-apiserver, an
upstream kubelet and kube-scheduler of the same release, containerd and runc. A pod without a
nodeName is bound by the scheduler, runs, logs, and is deleted; a socket a host process creates
in the kubelet's plugin registry is dialled by the kubelet (a DRA driver's registration path).

Runs only in its lane (scripts/test-real-node sets NODEAGENT_REAL_NODE=1): it needs root, the
machine conditions the doc lists, and minutes of builds the first time."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support.apiserver import ApiServer, selected_release, start_apiserver
from tests.support.realnode import RealNode, real_node_apiserver_kwargs, start_real_node
from tests.support.wait import until

pytestmark = pytest.mark.skipif(
    os.environ.get("NODEAGENT_REAL_NODE") != "1",
    reason="real-node lane only: run scripts/test-real-node (sets NODEAGENT_REAL_NODE=1)",
)

MARKER = "real-node-smoke: container ran"


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    d = tmp_path_factory.mktemp("api")
    srv = start_apiserver(
        d, release=selected_release(), gates="default", **real_node_apiserver_kwargs(d)
    )
    with srv:
        yield srv


@pytest.fixture(scope="module")
def node(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    with start_real_node(apiserver, tmp_path_factory.mktemp("node")) as rn:
        rn.load_images()
        yield rn


def test_node_reports_the_release(apiserver: ApiServer, node: RealNode) -> None:
    obj = node.node_object()
    assert obj is not None
    info = obj["status"]["nodeInfo"]
    assert info["kubeletVersion"] == apiserver.version
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"] == node.node_ip


def test_kubelet_dials_a_socket_made_by_a_host_process(node: RealNode) -> None:
    """The plugin watcher (inotify on registry_dir) sees a socket bound by this process, outside
    the node's mount namespace, and the kubelet connects to it (it then asks for GetInfo, which
    this listener does not answer: that failure is the kubelet's, not the test's)."""
    path = node.registry_dir / "realnode-smoke-reg.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(4)
        listener.setblocking(False)

        def dialled() -> bool | None:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return None  # no connection from the kubelet yet
            conn.close()
            return True

        until(dialled, f"the kubelet to dial {path}", timeout=60)
        path.unlink()
    assert str(path) in node.kubelet_log.read_text()


def _pod_log(apiserver: ApiServer, name: str) -> str:
    """The pod's log through the apiserver (served by the kubelet); raises until it has MARKER,
    so that a timeout says what the apiserver last answered."""
    status, body = apiserver.request("GET", f"/api/v1/namespaces/default/pods/{name}/log")
    if status != 200 or MARKER not in str(body):
        raise AssertionError(f"{status}: {str(body)[-300:]}")
    return str(body)


def test_scheduled_pod_runs_logs_and_is_deleted(apiserver: ApiServer, node: RealNode) -> None:
    name = "smoke"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            # No nodeName: kube-scheduler binds it. No token: the harness runs no controllers.
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/busybox:e2e",
                    "imagePullPolicy": "Never",
                    "command": [
                        "/bin/sh",
                        "-c",
                        f'echo "{MARKER}"; trap "exit 0" TERM; while :; do sleep 1; done',
                    ],
                }
            ],
        },
    }
    t0 = time.monotonic()
    status, body = apiserver.request("POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, body
    running = node.wait_pod_phase(name, ["Running"], timeout=120)
    assert running["spec"]["nodeName"] == node.node_name
    assert running["status"]["podIP"].startswith("10.244.77.")
    log = until(lambda: _pod_log(apiserver, name), f"pod {name}'s log through the apiserver")
    assert log.strip().splitlines()[0] == MARKER
    print(f"pod Running and logging {time.monotonic() - t0:.1f} s after creation")

    status, body = apiserver.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")
    assert status == 200, body
    node.wait_pod_gone(name, timeout=120)

    def no_tasks() -> bool:
        left = node.ctr("-n", "k8s.io", "tasks", "ls", "-q").split()
        if left:
            raise AssertionError(f"tasks {left}")
        return True

    until(no_tasks, "containerd to stop the pod's containers", timeout=60)
