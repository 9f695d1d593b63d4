"""Every object the chart renders (`helm template --include-crds`), with the default values and with
tests/deploy/helm-values-full.yaml, server-side applied to the real kube-apiserver the way an
operator's tooling does: each dry-run first, with fieldValidation=Strict (an unknown field is an
error, for the chart's built-in kinds and for the Prometheus Operator's PodMonitor, ServiceMonitor
and PrometheusRule alike, checked against that operator's own CRDs). The agent running as the
chart's DaemonSet pod is test_deploy_daemonset.py's."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator

import msgspec
import pytest

from nodeagent.kube import ClusterConfig, KubeClient, errors
from tests.deploy.manifests import CHART_RELEASE, CHART_VALUES, apply_docs, chart_install
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.helm import template

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
