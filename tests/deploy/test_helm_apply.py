"""Every object the chart renders (`helm template --include-crds`), with the default values and with
tests/deploy/helm-values-full.yaml, server-side applied to the real kube-apiserver the way an
operator's tooling does: each dry-run first, with fieldValidation=Strict (an unknown field is an
error, for the chart's built-in kinds and for the Prometheus Operator's PodMonitor, ServiceMonitor
and PrometheusRule alike, checked against that operator's own CRDs). The agent running as the
chart's DaemonSet pod is test_deploy_daemonset.py's."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from nodeagent.kube import NODES, ClusterConfig, KubeClient, errors
from tests.deploy.manifests import (
    CHART_RELEASE,
    CHART_VALUES,
    PLAIN,
    apply_docs,
    chart_install,
    pod_token,
)
from tests.support.apiserver import ApiServer, apiserver_fixture, free_ports
from tests.support.crds import REPO_ROOT
from tests.support.helm import template
from tests.support.nodeagentconfig import NAC, nodeagentconfig
from tests.support.wait import NotYet, wait_until

# Its own apiserver: the policies applied here bind cluster-wide.
LEASE = "nodeagent-rollout-controller"
apiserver = apiserver_fixture(scope="module", name="apiserver")


@pytest.fixture
async def admin(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    config = ClusterConfig(
        server=apiserver.url, ca_file=str(apiserver.ca_file), token=apiserver.token("admin")
    )
    async with KubeClient(config, qps=500.0, burst=1000) as client:
        yield client


async def _read_back(admin: KubeClient, doc: dict[str, object]) -> dict[str, object]:
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    resource = await admin.discover(str(doc["apiVersion"]), str(doc["kind"]))
    namespace = meta.get("namespace") if resource.namespaced else None
    found: dict[str, object] = msgspec.json.decode(
        await admin.get(resource, meta["name"], namespace)
    )
    return found


async def test_the_default_values_apply(admin: KubeClient) -> None:
    # `helm install --create-namespace`: the Namespace is Helm's, not the chart's.
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nodeagent"}}
    docs = [namespace, *template(include_crds=True)]
    applied = await apply_docs(admin, docs, strict=True)
    kinds = sorted({kind for kind, _ in applied})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "DaemonSet",
        "Deployment",
        "Namespace",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for doc in docs:
        found = await _read_back(admin, doc)
        assert found["kind"] == doc["kind"]


# What the rollout controller's account may do, as the apiserver's RBAC authorizer answers a
# SubjectAccessReview once the default values are applied: (verb, group, resource, subresource,
# namespace, name) -> allowed.
CONTROLLER_ACCESS = [
    (("watch", "nodeagent.io", "nodeagentconfigs", "", "", ""), True),
    (("update", "nodeagent.io", "nodeagentconfigs", "status", "", "web"), True),
    (("patch", "nodeagent.io", "nodeagentconfigs", "status", "", "web"), True),
    (("update", "nodeagent.io", "nodeagentconfigs", "", "", "web"), False),  # not the spec
    (("delete", "nodeagent.io", "nodeagentconfigs", "", "", "web"), False),
    (("create", "nodeagent.io", "nodeagentconfigs", "", "", ""), False),
    (("list", "", "nodes", "", "", ""), True),
    (("patch", "", "nodes", "status", "", "node-a"), False),  # the agents' condition, not its
    (("list", "", "pods", "", "", ""), False),
    (("get", "", "secrets", "", "nodeagent", ""), False),
    (("create", "", "events", "", "default", ""), True),
    (("create", "coordination.k8s.io", "leases", "", "nodeagent", ""), True),
    (("update", "coordination.k8s.io", "leases", "", "nodeagent", LEASE), True),
    (("update", "coordination.k8s.io", "leases", "", "nodeagent", "another"), False),
    (("get", "coordination.k8s.io", "leases", "", "kube-system", LEASE), False),
    (("delete", "coordination.k8s.io", "leases", "", "nodeagent", LEASE), False),
]


async def test_the_rollout_controller_may_do_what_it_needs_and_no_more(admin: KubeClient) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nodeagent"}}
    await apply_docs(admin, [namespace, *template(include_crds=True)], strict=True)
    user = "system:serviceaccount:nodeagent:nodeagent-rollout-controller"
    reviews = await admin.discover("authorization.k8s.io/v1", "SubjectAccessReview")
    answers = []
    for (verb, group, resource, sub, ns, name), _ in CONTROLLER_ACCESS:
        attributes = {"verb": verb, "group": group, "resource": resource}
        for key, value in (("subresource", sub), ("namespace", ns), ("name", name)):
            if value:
                attributes[key] = value
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": attributes},
        }
        review = msgspec.json.decode(await admin.create(reviews, body))
        answers.append(((verb, group, resource, sub, ns, name), review["status"]["allowed"]))
    assert answers == CONTROLLER_ACCESS


async def test_the_full_values_apply(admin: KubeClient) -> None:
    docs = list(chart_install().docs)  # the Prometheus Operator's CRDs, then the chart's
    applied = await apply_docs(admin, docs, strict=True)
    kinds = {kind for kind, _ in applied}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Service", "ConfigMap"} <= kinds
    release, namespace = CHART_RELEASE
    rule = await _read_back(admin, next(d for d in docs if d["kind"] == "PrometheusRule"))
    spec = rule["spec"]
    assert isinstance(spec, dict) and len(spec["groups"]) >= 1
    daemonset = await _read_back(admin, next(d for d in docs if d["kind"] == "DaemonSet"))
    assert daemonset["metadata"]["namespace"] == namespace  # type: ignore[index]
    assert CHART_VALUES.exists() and release == "edge"


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor", "DaemonSet"])
async def test_strict_validation_refuses_an_unknown_field(admin: KubeClient, kind: str) -> None:
    """The strict dry-run is a real check: a misspelt field in a rendered object is refused,
    naming the field (for the custom resources too, by their CRD's schema)."""
    docs = list(chart_install().docs)
    await apply_docs(
        admin, [d for d in docs if d["kind"] in ("CustomResourceDefinition", "Namespace")]
    )
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == kind))
    field = "tolerationz" if kind == "DaemonSet" else "namespaceSelectr"
    spec = broken["spec"]["template"]["spec"] if kind == "DaemonSet" else broken["spec"]
    spec[field] = {}
    with pytest.raises(errors.ApiError) as refused:
        await apply_docs(admin, [broken], strict=True)
    assert field in refused.value.message


def _start(args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
    """`nodeagent <args>` as the pod runs it: $(POD_NAME) expanded as the kubelet does, from the
    downward API's env."""
    args = [a.replace("$(POD_NAME)", "rollout-pod-1") for a in args]
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nodeagent", *args],
            env={"POD_NAME": "rollout-pod-1", "PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def test_the_rollout_controller_runs_with_its_own_account(
    apiserver: ApiServer, admin: KubeClient, tmp_path: pathlib.Path
) -> None:
    """`nodeagent rollout-controller` as the chart's Deployment runs it, with a token of the
    chart's ServiceAccount for it: it takes its Lease, writes a rollout's status and posts its
    Events with nothing refused (a grant missing from the chart's RBAC would show as a 403 in
    its log and no status)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nodeagent"}}
    await apply_docs(admin, [namespace, *template(include_crds=True)], strict=True)
    account = dataclasses.replace(PLAIN, service_account="nodeagent-rollout-controller")
    token = await pod_token(admin, None, install=account)
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": apiserver.url,
                            "certificate-authority": str(apiserver.ca_file),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(NODES, {"metadata": {"name": "rollout-node", "labels": {"x": "y"}}})
    spec = {"nodeSelector": {"matchLabels": {"x": "y"}}, "config": {}, "rollout": {}}
    await admin.create(NAC, nodeagentconfig("chart-rollout", spec=spec))
    # The Deployment's args, but the metrics port (the harness's host is shared).
    deployment = next(
        d
        for d in template()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "nodeagent-rollout-controller"
    )
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    port = free_ports(1)[0]
    args = [
        f"--metrics-address=127.0.0.1:{port}" if a.startswith("--metrics-address") else a
        for a in args
    ]
    log = tmp_path / "controller.log"
    proc = _start([*args, "--kubeconfig", str(config)], log)
    try:

        async def written() -> dict[str, Any] | NotYet:
            obj = msgspec.json.decode(await admin.get(NAC, "chart-rollout"))
            rollout = (obj.get("status") or {}).get("rollout")
            return rollout if rollout and rollout["admitted"] == 1 else NotYet(obj.get("status"))

        rollout = await wait_until(written, "the controller's status write", timeout=60)
        assert rollout["phase"] == "Progressing"
        leases = await admin.discover("coordination.k8s.io/v1", "Lease")
        lease = msgspec.json.decode(
            await admin.get(leases, "nodeagent-rollout-controller", "nodeagent")
        )
        assert lease["spec"]["holderIdentity"] == "rollout-pod-1"
        events = await admin.discover("v1", "Event")

        async def posted() -> set[str] | NotYet:
            listed = await admin.list(events, "default")
            reasons = {
                e["reason"]
                for e in (msgspec.json.decode(item) for item in listed.items)
                if e["involvedObject"].get("name") == "chart-rollout"
            }
            return reasons if {"RolloutStarted", "WaveStarted"} <= reasons else NotYet(reasons)

        await wait_until(posted, "the controller's Events", timeout=60)
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert "Forbidden" not in text and "403" not in text, text
