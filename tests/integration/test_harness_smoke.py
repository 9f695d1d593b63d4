"""Smoke test of the real kube-apiserver harness (tests/support/apiserver.py)."""

from __future__ import annotations

import json
import pathlib
import re
import ssl
import sys
import threading
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

try:
    from tests.support import apiserver as harness
    from tests.support.apiserver import ApiServer, start_apiserver
except ImportError:  # pytest run without the repo root on sys.path
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    from tests.support import apiserver as harness
    from tests.support.apiserver import ApiServer, start_apiserver

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = start_apiserver(tmp_path_factory.mktemp("harness-smoke"))
    try:
        yield s
    finally:
        s.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _slice(node: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": _name(f"{node}-slice")},
        "spec": {
            "driver": "example.com",
            "nodeName": node,
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}],
        },
    }


def _first_watch_event(srv: ApiServer, path: str) -> tuple[int, dict | None]:
    """Open a watch; return (HTTP status, first event or error Status)."""
    req = urllib.request.Request(srv.url + path, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, context=srv.ssl_context("admin"), timeout=30) as resp:
            line = resp.readline()
            return resp.status, (json.loads(line) if line.strip() else None)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _is_gone(status: int, ev: dict | None) -> bool:
    if status == 410:
        return True
    return bool(ev and ev.get("type") == "ERROR" and ev["object"].get("code") == 410)


def test_version(srv: ApiServer) -> None:
    status, body = srv.request("GET", "/version")
    assert status == 200, body
    assert body["major"] == "1"
    minor = re.match(r"\d+", body["minor"])
    assert minor is not None and int(minor.group()) >= 35
    assert srv.version == body["gitVersion"] and srv.version.startswith("v1.")
    # The release the environment selected (the newest by default), at its pinned version.
    assert srv.release == harness.selected_release() == f"1.{minor.group()}"
    assert srv.version == harness.release_version(srv.release)
    assert srv.url.startswith("https://127.0.0.1:")
    assert srv.etcd_url.startswith("http://127.0.0.1:")


def test_releases_newest_first_and_selection_errors() -> None:
    releases = harness.releases()
    assert {"1.35", "1.36", "1.37"} <= set(releases)
    assert list(releases) == sorted(releases, key=lambda r: int(r.split(".")[1]), reverse=True)
    assert harness.newest_release() == releases[0]
    with pytest.raises(ValueError, match=re.escape("unknown Kubernetes release '1.99'")):
        start_apiserver(pathlib.Path("/nonexistent"), release="1.99")
    assert harness.release_version("1.37") == "v1.37.2"
    with pytest.raises(ValueError, match=re.escape("pinned to v1.37.2, not v1.37.0")):
        start_apiserver(pathlib.Path("/nonexistent"), release="v1.37.0")
    with pytest.raises(ValueError, match="expected one of default, all-dra"):
        start_apiserver(pathlib.Path("/nonexistent"), gates="all")


def test_feature_gates_as_the_server_reports_them(srv: ApiServer) -> None:
    enabled = srv.enabled_features()
    features = harness.harness_features(srv.release).features
    # The running server and the binary's own table agree on every default.
    if srv.gates == "default":
        assert {n: f.default for n, f in features.items() if n in enabled} == enabled
    assert srv.feature_enabled("DynamicResourceAllocation")
    assert not srv.feature_enabled("NoSuchGate")


def test_all_dra_lane_turns_on_every_dra_gate(tmp_path: pathlib.Path) -> None:
    """The all-dra lane: every DRA gate of the release a user may change (alpha included) is
    on, no locked gate was passed, and every resource.k8s.io version is served."""
    release = harness.selected_release()
    features = harness.harness_features(release)
    gates = harness.dra_gates(release)
    assert all(not features.features[n].locked for n in gates)
    dra = {
        n
        for n, f in features.features.items()
        if n.startswith("DRA") and not f.locked and f.pre_release in ("ALPHA", "BETA")
    }
    assert dra and dra <= set(gates)
    with start_apiserver(tmp_path, nodes=("node-a",), gates="all-dra") as s:
        assert s.gates == "all-dra" and s.set_gates == gates
        enabled = s.enabled_features()
        assert {n: enabled.get(n) for n in gates} == dict.fromkeys(gates, True)
        status, body = s.request("GET", "/apis/resource.k8s.io")
        assert status == 200, body
        served = [v["version"] for v in body["versions"]]
        assert sorted(served) == sorted(features.resource_versions)


def test_resource_v1_served(srv: ApiServer) -> None:
    status, body = srv.request("GET", "/apis/resource.k8s.io/v1")
    assert status == 200, body
    names = {r["name"] for r in body["resources"]}
    assert "resourceslices" in names, names


def test_kubeconfigs_and_pem_files(srv: ApiServer) -> None:
    for ident in ("admin", "node-a", "node-b", "token"):
        text = srv.kubeconfig(ident).read_text()
        assert f"server: {srv.url}" in text
        assert "certificate-authority-data:" in text
    for f in ("ca.crt", "admin.crt", "admin.key", "node-a.crt", "node-a.key", "tokens.csv"):
        assert (srv.dir / f).is_file(), f
    assert len({srv.token("admin"), srv.token("token-a"), srv.token("token-b")}) == 3


def test_node_identity_and_node_restriction(srv: ApiServer) -> None:
    # A node may register its own Node object, not another one.
    node_a = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
    status, body = srv.request("POST", "/api/v1/nodes", node_a, identity="node-a")
    assert status == 201, body
    node_b = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}
    status, body = srv.request("POST", "/api/v1/nodes", node_b, identity="node-a")
    assert status == 403, body
    status, body = srv.request("POST", "/api/v1/nodes", node_b, identity="admin")
    assert status == 201, body

    status, body = srv.request("GET", "/api/v1/nodes/node-a", identity="node-a")
    assert status == 200, body
    assert body["metadata"]["name"] == "node-a"

    # ResourceSlices: allowed for its own nodeName, Forbidden for another node's.
    status, body = srv.request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("node-b"), identity="node-a"
    )
    assert status == 403, body
    status, body = srv.request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", _slice("node-a"), identity="node-a"
    )
    assert status == 201, body
    assert body["spec"]["nodeName"] == "node-a"
    name = body["metadata"]["name"]
    # node-b may not delete node-a's slice; node-a may.
    path = f"/apis/resource.k8s.io/v1/resourceslices/{name}"
    status, body = srv.request("DELETE", path, identity="node-b")
    assert status == 403, body
    status, body = srv.request("DELETE", path, identity="node-a")
    assert status == 200, body


def test_token_auth(srv: ApiServer) -> None:
    for name in ("admin", "token-a", "token-b"):
        status, body = srv.request("GET", "/api/v1/namespaces/default", token=srv.token(name))
        assert status == 200, (name, body)
    status, body = srv.request("GET", "/apis/authentication.k8s.io/v1", token=srv.token("token-a"))
    assert status == 200
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    status, body = srv.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        review,
        token=srv.token("token-b"),
    )
    assert status == 201, body
    assert body["status"]["userInfo"]["username"] == "token-user"
    assert "system:masters" in body["status"]["userInfo"]["groups"]
    status, _ = srv.request("GET", "/api/v1/namespaces/default", token="not-a-valid-token")
    assert status == 401


def test_token_kubeconfig_without_client_cert(srv: ApiServer) -> None:
    ctx = ssl.create_default_context(cafile=str(srv.dir / "ca.crt"))
    token = next(
        ln.split(":", 1)[1].strip()
        for ln in srv.kubeconfig("token").read_text().splitlines()
        if "token:" in ln
    )
    req = urllib.request.Request(
        srv.url + "/api/v1/namespaces", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        assert resp.status == 200


def test_a_stop_with_a_watch_open_ends_the_watch_and_the_server_by_itself(srv: ApiServer) -> None:
    """stop_apiserver() is kube-apiserver's own graceful shutdown, finished: the server ends the
    open watches (a clean end of the stream) and exits 0, instead of holding them until the
    harness's SIGKILL 30 s later (what every test restarting an apiserver under an agent paid)."""
    opened = threading.Event()
    outcome: list[str] = []

    def watch() -> None:
        req = urllib.request.Request(
            srv.url + "/api/v1/namespaces?watch=1", headers={"Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=srv.ssl_context("admin"), timeout=120) as r:
                opened.set()
                while r.read(1):
                    pass
            outcome.append("ended")
        except Exception as exc:  # a reset or a truncated chunk: the server did not end it
            outcome.append(repr(exc))
        finally:
            opened.set()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    assert opened.wait(30) and not outcome, outcome
    try:
        assert srv.stop_apiserver() == 0  # not -9: the harness's SIGKILL
        reader.join(30)
        assert outcome == ["ended"]
    finally:
        srv.start_apiserver()


def test_restart_preserves_state(srv: ApiServer) -> None:
    name = _name("cm")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}
    status, body = srv.request("POST", "/api/v1/namespaces/default/configmaps", cm)
    assert status == 201, body
    old_port = srv.url
    srv.restart()
    assert srv.url == old_port
    status, body = srv.request("GET", f"/api/v1/namespaces/default/configmaps/{name}")
    assert status == 200, body
    assert body["data"] == {"k": "v"}

    # stop/start halves: no server in between.
    srv.stop_apiserver()
    with pytest.raises(OSError):
        srv.request("GET", "/readyz", timeout=5)
    srv.start_apiserver()
    status, _ = srv.request("GET", f"/api/v1/namespaces/default/configmaps/{name}")
    assert status == 200


def test_compact_gives_410_on_old_watch(srv: ApiServer) -> None:
    # core/v1 events have no watch cache: their watches go straight to etcd.
    def event(name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": "default"},
            "reason": "Test",
            "message": "harness smoke",
            "type": "Normal",
        }

    status, e1 = srv.request("POST", "/api/v1/namespaces/default/events", event(_name("ev")))
    assert status == 201, e1
    old_rv = e1["metadata"]["resourceVersion"]
    # etcd keeps the compaction revision itself, and a watch from RV X starts at
    # X+1: two more writes put old_rv+1 strictly below the compaction point.
    for _ in range(2):
        status, e2 = srv.request("POST", "/api/v1/namespaces/default/events", event(_name("ev")))
        assert status == 201, e2

    # Before compaction the old resourceVersion is still watchable.
    status, ev = _first_watch_event(
        srv, f"/api/v1/namespaces/default/events?watch=1&resourceVersion={old_rv}&timeoutSeconds=5"
    )
    assert status == 200 and ev and ev["type"] == "ADDED", ev

    rev = srv.compact()
    assert rev >= int(e2["metadata"]["resourceVersion"])
    status, ev = _first_watch_event(
        srv, f"/api/v1/namespaces/default/events?watch=1&resourceVersion={old_rv}&timeoutSeconds=5"
    )
    assert _is_gone(status, ev), (status, ev)
    # An exact-revision list goes to etcd too.
    status, body = srv.request(
        "GET",
        f"/api/v1/namespaces/default/events?resourceVersion={old_rv}&resourceVersionMatch=Exact",
    )
    assert status == 410, body


def test_compact_and_restart_gives_410_on_cached_resource(srv: ApiServer) -> None:
    # ConfigMaps are served from the watch cache, which keeps its own event
    # window; after a restart the cache starts at the current revision.
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": _name("cm")},
        "data": {"a": "1"},
    }
    status, body = srv.request("POST", "/api/v1/namespaces/default/configmaps", cm)
    assert status == 201, body
    old_rv = body["metadata"]["resourceVersion"]
    status, _ = srv.request(
        "PATCH",
        f"/api/v1/namespaces/default/configmaps/{cm['metadata']['name']}",
        {"data": {"a": "2"}},
    )
    assert status == 200
    srv.compact()
    srv.restart()
    status, ev = _first_watch_event(
        srv,
        f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old_rv}&timeoutSeconds=5",
    )
    assert _is_gone(status, ev), (status, ev)
