"""The Helm chart deploy/helm/nodeagent without a cluster, with the real `helm` (built from the
Go module proxy by tests/harness/helm/build.sh): `helm lint --strict`, `helm template` with the
default values and with tests/deploy/helm-values-full.yaml validated strictly by kubernetes-validate
for the harness's Kubernetes version, the values reaching the objects, the config values rendered
into a TOML file the agent itself accepts, the refusals of bad values, and the one source of truth:
the plain manifests of deploy/kubernetes (and the chart's copies of the CRDs and monitoring files)
are exactly what scripts/render-manifests writes. test_helm_apply.py applies the objects to the real
kube-apiserver; test_deploy_daemonset.py runs the agent as the chart's DaemonSet pod."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tomllib
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs or py.typed
import msgspec
import pytest

import nodeagent
from tests.deploy.manifests import CHART_RELEASE, CHART_VALUES, KUBERNETES_DIR, PLAIN
from tests.deploy.test_deploy_schemas import harness_version
from tests.support.crds import REPO_ROOT, load_manifest
from tests.support.helm import CHART, IMAGE_VALUES, helm, helm_binary, template

VALUES = {"default": [], "full": [CHART_VALUES]}
MONITORING_GROUP = "monitoring.coreos.com"
# What `helm template` adds to the plain manifests' objects (the Namespace comes from the values).
HELM_LABELS = ("app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart")
# The required image.repository, for the helm commands run here directly (template() has it).
IMAGE = ["--values", str(IMAGE_VALUES)]
# The rollout controller's objects in the full values' release.
ROLLOUT_CONTROLLER = f"{CHART_RELEASE[0]}-nodeagent-rollout-controller"


def _full_values() -> dict[str, Any]:
    values: dict[str, Any] = msgspec.yaml.decode(CHART_VALUES.read_bytes())
    return values


def _render(which: str) -> list[dict[str, Any]]:
    if which == "default":
        return template()
    release, namespace = CHART_RELEASE
    return template(release, namespace, VALUES[which])


def _only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _config_toml(tmp_path: pathlib.Path, config: dict[str, Any], *, checked: bool = True) -> str:
    """The config.toml the chart renders for ``config`` (a values file of its own); ``checked``:
    with the values' schema (the agent's own for config)."""
    values = tmp_path / "config-values.yaml"
    values.write_bytes(msgspec.json.encode({"config": config}))  # JSON is YAML
    configmap = template(values=[values], skip_schema=not checked)
    text: str = _only([d for d in configmap if d["kind"] == "ConfigMap"], "ConfigMap")["data"][
        "config.toml"
    ]
    return text


def test_helm_is_the_pinned_version() -> None:
    go_mod = (REPO_ROOT / "tests" / "harness" / "helm" / "go.mod").read_text()
    (pinned,) = re.findall(r"^\s*helm\.sh/helm/v3 (v\S+)", go_mod, re.M)
    assert helm("version", "--template", "{{ .Version }}").stdout == pinned
    assert helm_binary().parent.name.startswith("helm-")  # the cache of tests/harness/helm/build.sh


def test_the_chart_is_the_package_version() -> None:
    chart = msgspec.yaml.decode((CHART / "Chart.yaml").read_bytes())
    assert chart["version"] == chart["appVersion"] == nodeagent.__version__


@pytest.mark.parametrize("which", VALUES)
def test_lint_strict(which: str) -> None:
    args = ["lint", "--strict", str(CHART), *IMAGE]
    for path in VALUES[which]:
        args += ["--values", str(path)]
    answer = helm(*args, check=False)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in answer.stdout
    assert "[WARNING]" not in answer.stdout and "[ERROR]" not in answer.stdout


def test_lint_strict_fails_on_a_broken_template(tmp_path: pathlib.Path) -> None:
    # The same lint on a copy of the chart with a template that renders no valid YAML.
    broken = tmp_path / "nodeagent"
    subprocess.run(["cp", "-r", str(CHART), str(broken)], check=True)
    path = broken / "templates" / "serviceaccount.yaml"
    path.write_text(path.read_text().replace("kind: ServiceAccount", "kind: [ServiceAccount"))
    answer = helm("lint", "--strict", str(broken), *IMAGE, check=False)
    assert answer.returncode != 0
    assert "serviceaccount.yaml" in answer.stdout + answer.stderr


@pytest.mark.parametrize("which", VALUES)
def test_rendered_objects_are_valid_for_the_harness_version(which: str) -> None:
    docs = _render(which)
    kinds = {doc["kind"] for doc in docs}
    assert {"ServiceAccount", "ClusterRole", "DaemonSet", "ValidatingAdmissionPolicy"} <= kinds
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(MONITORING_GROUP):
            continue  # no schema offline: test_helm_apply.py checks them against the CRDs
        validated = kubernetes_validate.validate(doc, harness_version(), strict=True)
        assert validated == harness_version().rsplit(".", 1)[0]
        checked += 1
    assert checked >= (8 if which == "default" else 17)


def test_the_oldest_kubernetes_the_chart_accepts_is_the_oldest_it_is_valid_for() -> None:
    """Chart.yaml's kubeVersion (>= 1.30) is where every object the full values render becomes
    valid: 1.30's schemas accept them all, 1.29's refuse ValidatingAdmissionPolicy v1, and
    helm refuses to render for 1.29."""
    release, namespace = CHART_RELEASE
    docs = template(release, namespace, [CHART_VALUES], sets=[])
    builtin = [d for d in docs if not d["apiVersion"].startswith(MONITORING_GROUP)]
    for doc in builtin:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    refused = set()
    for doc in builtin:
        try:
            kubernetes_validate.validate(doc, "1.29.0", strict=True)
        except kubernetes_validate.SchemaNotFoundError:  # no such apiVersion in 1.29
            refused.add(doc["kind"])
    assert refused == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    args = ["template", "x", str(CHART), *IMAGE, "--kube-version", "1.29.9"]
    answer = helm(*args, check=False)
    assert answer.returncode != 0
    assert "requires kubeVersion: >=1.30.0-0" in answer.stderr, answer.stderr


def test_the_crds_are_in_the_charts_crds_directory() -> None:
    docs = template(include_crds=True)
    crds = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crds == [
        "customnoderesources.node.katalyst.kubewharf.io",
        "nodeagentconfigs.nodeagent.io",
    ]
    assert not [d for d in template() if d["kind"] == "CustomResourceDefinition"]


def test_render_manifests_reproduces_the_tree(tmp_path: pathlib.Path) -> None:
    """deploy/kubernetes, the chart's crds/ and files/ are byte for byte what the script writes."""
    answer = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "render-manifests"), "--out", str(tmp_path)],
        env=os.environ | {"NODEAGENT_HELM": str(helm_binary())},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    chart = CHART.relative_to(REPO_ROOT)
    expected = sorted(
        [p.relative_to(REPO_ROOT) for p in KUBERNETES_DIR.glob("*.yaml")]
        + [p.relative_to(REPO_ROOT) for p in (CHART / "crds").iterdir()]
        + [p.relative_to(REPO_ROOT) for p in (CHART / "files").iterdir()]
        + [(CHART / "values.schema.json").relative_to(REPO_ROOT)]
    )
    assert written == expected
    assert len([p for p in written if p.parent == chart / "crds"]) == 2
    stale = [
        str(path)
        for path in written
        if (tmp_path / path).read_bytes() != (REPO_ROOT / path).read_bytes()
    ]
    assert not stale, f"run scripts/render-manifests: {stale} differ from the chart's output"


def test_the_plain_manifests_are_the_charts_default_values() -> None:
    """What the default values install is the plain manifests' DaemonSet install, objects and
    fields alike, but for the labels saying Helm manages them (and the Namespace, which
    `helm install --create-namespace` makes)."""
    plain_files = [KUBERNETES_DIR / "nodeagent.yaml"]
    plain = [doc for path in plain_files for doc in load_manifest(path)]
    charted = template(sets=["createNamespace=true"])
    for doc in charted:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        for key in HELM_LABELS:
            del labels[key]
        template_labels = doc.get("spec", {}).get("template", {}).get("metadata", {})
        for key in HELM_LABELS:
            template_labels.get("labels", {}).pop(key, None)
    assert charted == plain


def test_full_values_reach_the_daemonset() -> None:
    values = _full_values()
    daemonset = _only(_render("full"), "DaemonSet")
    _, namespace = CHART_RELEASE
    assert daemonset["metadata"]["namespace"] == namespace
    pod = daemonset["spec"]["template"]
    spec = pod["spec"]
    ds = values["daemonset"]
    assert spec["tolerations"] == ds["tolerations"]
    assert spec["nodeSelector"] == ds["nodeSelector"]
    assert spec["affinity"] == ds["affinity"]
    assert spec["imagePullSecrets"] == values["imagePullSecrets"]
    assert spec["serviceAccountName"] == values["serviceAccount"]["name"]
    assert daemonset["spec"]["updateStrategy"] == ds["updateStrategy"]
    (container,) = spec["containers"]
    image = values["image"]
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert container["imagePullPolicy"] == image["pullPolicy"]
    assert container["resources"] == ds["resources"]
    assert container["ports"] == [{"name": "metrics", "containerPort": ds["metricsPort"]}]
    assert f"--ops-address=127.0.0.1:{ds['opsPort']}" in container["args"]
    assert f"--state-dir={ds['hostStateDir']}" in container["args"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ds["metricsPort"])
    assert pod["metadata"]["labels"]["example.com/tier"] == "node"
    for doc in _render("full"):
        assert doc["metadata"]["labels"]["team.example.com/owner"] == "platform", doc["kind"]


def test_every_object_names_the_release() -> None:
    release, namespace = CHART_RELEASE
    docs = _render("full")
    user = f"system:serviceaccount:{namespace}:agent"
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 4  # the DaemonSet's three and the node-credentials CNR policy
    for policy in policies:
        assert policy["metadata"]["name"].startswith(f"{release}-nodeagent")
        for condition in policy["spec"].get("matchConditions", []):
            if "serviceaccount" in condition["expression"]:
                assert condition["expression"] == f"request.userInfo.username == '{user}'"
    bindings = [
        d
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and "subjects" in d
        and d["subjects"][0]["kind"] == "ServiceAccount"
    ]
    assert sorted(
        (b["kind"], b["metadata"]["name"], b["subjects"][0]["name"]) for b in bindings
    ) == [
        ("ClusterRoleBinding", f"{release}-nodeagent", "agent"),
        ("ClusterRoleBinding", ROLLOUT_CONTROLLER, ROLLOUT_CONTROLLER),
        ("RoleBinding", ROLLOUT_CONTROLLER, ROLLOUT_CONTROLLER),
    ]
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == namespace


def test_the_config_values_are_the_agents_config_file(tmp_path: pathlib.Path) -> None:
    """The full values' config renders to a TOML file that `nodeagent check-config` accepts and
    whose effective values are the ones given (integers stay integers)."""
    values = _full_values()["config"]
    text = _config_toml(tmp_path, values)
    assert tomllib.loads(text) == values
    path = tmp_path / "config.toml"
    path.write_text(text)
    answer = subprocess.run(
        [sys.executable, "-m", "nodeagent", "check-config", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert answer.returncode == 0, answer.stdout + answer.stderr
    effective = json.loads(answer.stdout)
    for section, fields in values.items():
        for key, value in fields.items():
            assert effective[section][key] == value, f"{section}.{key}"


def test_the_toml_rendering_round_trips(tmp_path: pathlib.Path) -> None:
    config = {
        "strings": {
            "quotes": 'say "hi"',
            "backslash": "C:\\path\\",
            "newline": "a\nb\tc",
            "unicode": "Grüße ✓ <&>",
            "empty": "",
            "needs.quoting/key": "x",
            "spaced key": "y",
        },
        "numbers": {
            "zero": 0,
            "negative": -7,
            "large": 2**40,
            "fraction": 0.25,
            "small": 0.001,
            "huge": 1e300,
            "integral_float": 2.5e10,
        },
        "lists": {
            "ints": [0, 65532],
            "strings": ["/var/lib/kubelet/plugins", 'q"'],
            "empty": [],
            "mixed_tables": [{"a": 1, "b": "two"}],
        },
        "flags": {"on": True, "off": False},
        "nested": {"deeper": {"deepest": {"leaf": 1}}, "value": "v"},
        "empty_table": {},
    }
    # Sections of no agent: the TOML writer alone, past the schema.
    parsed = tomllib.loads(_config_toml(tmp_path, config, checked=False))
    assert parsed == config
    # Integers the values wrote as integers stay integers (the agent's int fields refuse 5.0).
    assert type(parsed["numbers"]["large"]) is int
    assert type(parsed["lists"]["ints"][1]) is int
    assert type(parsed["numbers"]["fraction"]) is float
    assert math.isclose(parsed["numbers"]["huge"], 1e300)


@pytest.mark.parametrize("checked", [True, False])
def test_a_null_config_value_is_refused(tmp_path: pathlib.Path, checked: bool) -> None:
    # By the agent's schema, and without it by the chart's TOML writer (TOML has no null).
    values = tmp_path / "null.yaml"
    values.write_text("config:\n  agent:\n    log_level: null\n")
    args = ["template", "x", str(CHART), *IMAGE, "--values", str(values)]
    answer = helm(*args, *([] if checked else ["--skip-schema-validation"]), check=False)
    assert answer.returncode != 0
    named = "/config/agent/log_level" if checked else "config.agent.log_level: TOML has no null"
    assert named in answer.stderr, answer.stderr


@pytest.mark.parametrize(
    ("assignment", "named"),
    [
        ("daemonset.opsPrt=1", "opsPrt"),
        ("daemonset.metricsPort=http", "/daemonset/metricsPort"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("metrics.podMonitor.enable=true", "enable"),
        ("config.ops.address=0.0.0.0:1", "config.ops.address"),
        # The agent's own schema of its configuration (values.schema.json's $defs).
        ("config.plugins.scan_intervall=1", "scan_intervall"),
        ("config.agent.log_level=loud", "/config/agent/log_level"),
        ("config.plugins.probe_failures=many", "/config/plugins/probe_failures"),
        ("config.kubernetes.qps=5", "kubernetes"),
        ("config.agent.node_name=x", "config.agent.node_name"),
        ("config.plugins.registry_dir=/x", "config.plugins.registry_dir"),
        ("daemonset.kubeletPlugins.dir=var/lib/kubelet", "/daemonset/kubeletPlugins/dir"),
        ("daemonset.kubeletPlugins.dir=/var/lib/kubelet/", "/daemonset/kubeletPlugins/dir"),
        ("daemonset.kubeletPlugins.enable=true", "enable"),
        ("daemonset.kubeletPlugins.watchRegistry=yes", "/daemonset/kubeletPlugins/watchRegistry"),
        # The kubelet's registry is watched only where it is mounted.
        ("daemonset.kubeletPlugins.watchRegistry=true", "/daemonset/kubeletPlugins/enabled"),
        ("daemonset.extraVolumes[0].emptyDir.medium=Memory", "/daemonset/extraVolumes/0"),
        ("daemonset.extraVolumeMounts[0].name=x", "/daemonset/extraVolumeMounts/0"),
        ("daemonset.extraVolumeMounts=x", "/daemonset/extraVolumeMounts"),
        ("rolloutController.replicas=-1", "/rolloutController/replicas"),
        ("rolloutController.metricsPort=0", "/rolloutController/metricsPort"),
        ("rolloutController.leaseName=x", "leaseName"),
    ],
)
def test_a_bad_value_is_refused_naming_it(assignment: str, named: str) -> None:
    answer = helm("template", "x", str(CHART), *IMAGE, "--set", assignment, check=False)
    assert answer.returncode != 0
    assert named in answer.stderr, answer.stderr


def test_the_image_repository_is_required_with_a_clear_message() -> None:
    """No default image: `nodeagent:<version>` resolved to a public registry where no such image
    exists and the pods stalled pulling it (issue 29 item 17). The message says what to set and
    where the image comes from; a chart without the DaemonSet and the rollout controller needs no
    image (a systemd-only install of the CRDs and grants)."""
    answer = helm("template", "x", str(CHART), check=False)
    assert answer.returncode != 0
    assert "image.repository is required" in answer.stderr, answer.stderr
    for hint in ("deploy/image/build.sh", "ctr -n k8s.io images import", "container-image.md"):
        assert hint in answer.stderr, answer.stderr
    args = ["--set", "daemonset.enabled=false", "--set", "nodeCredentialsAccess.enabled=true"]
    answer = helm("template", "x", str(CHART), *args, check=False)
    assert answer.returncode != 0 and "image.repository is required" in answer.stderr
    args += ["--set", "rolloutController.enabled=false"]
    assert helm("template", "x", str(CHART), *args, check=False).returncode == 0
    daemonset = _only(
        template(sets=["image.repository=registry.example.com/nodeagent"]), "DaemonSet"
    )
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.example.com/nodeagent:{nodeagent.__version__}"


def test_watch_registry_without_the_mounts_is_refused_past_the_schema() -> None:
    args = ["template", "x", str(CHART), *IMAGE, "--skip-schema-validation"]
    answer = helm(*args, "--set", "daemonset.kubeletPlugins.watchRegistry=true", check=False)
    assert answer.returncode != 0
    assert "daemonset.kubeletPlugins.watchRegistry: needs" in answer.stderr, answer.stderr


def _pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The DaemonSet's pod spec and its one container."""
    spec: dict[str, Any] = _only(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def _registry_arg(container: dict[str, Any]) -> str:
    (arg,) = [a for a in container["args"] if a.startswith("--registry-dir=")]
    return arg.removeprefix("--registry-dir=")


def _host_mounts(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> hostPath of every hostPath volume the container mounts."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]["hostPath"]
        for m in container["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


# The runtime directory's hostPath (daemonset.hostRuntimeDir), in every pod.
RUNTIME = {"/run/nodeagent": {"path": "/run/nodeagent", "type": "DirectoryOrCreate"}}


def test_by_default_the_agent_watches_its_own_registry_only() -> None:
    spec, container = _pod(template())
    assert _registry_arg(container) == "/var/lib/nodeagent/plugins_registry"
    assert (
        _host_mounts(spec, container)
        == {"/var/lib/nodeagent": {"path": "/var/lib/nodeagent", "type": "DirectoryOrCreate"}}
        | RUNTIME
    )
    assert [v["name"] for v in spec["volumes"]] == ["state", "runtime", "tmp"]
    # agent.runtime_dir, where dynconfig keeps its state while the state dir is read-only.
    assert {"name": "RUNTIME_DIRECTORY", "value": "/run/nodeagent"} in container["env"]


@pytest.mark.parametrize("watch", [False, True])
@pytest.mark.parametrize("kubelet_dir", ["/var/lib/kubelet", "/srv/kubelet"])
def test_kubelet_plugins_mount_the_kubelets_directories(watch: bool, kubelet_dir: str) -> None:
    """daemonset.kubeletPlugins: <dir>/plugins and <dir>/plugins_registry as hostPaths at the same
    paths in the pod (valid objects); watchRegistry: the agent's registry dir is the kubelet's."""
    sets = [
        "daemonset.kubeletPlugins.enabled=true",
        f"daemonset.kubeletPlugins.dir={kubelet_dir}",
        f"daemonset.kubeletPlugins.watchRegistry={str(watch).lower()}",
        "daemonset.hostStateDir=/var/lib/agent",
    ]
    docs = template(sets=sets)
    spec, container = _pod(docs)
    kubelet = {
        f"{kubelet_dir}/{sub}": {"path": f"{kubelet_dir}/{sub}", "type": "DirectoryOrCreate"}
        for sub in ("plugins", "plugins_registry")
    }
    state = {"/var/lib/agent": {"path": "/var/lib/agent", "type": "DirectoryOrCreate"}}
    assert _host_mounts(spec, container) == state | RUNTIME | kubelet
    registry = f"{kubelet_dir if watch else '/var/lib/agent'}/plugins_registry"
    assert _registry_arg(container) == registry
    assert "--state-dir=/var/lib/agent" in container["args"]
    validated = kubernetes_validate.validate(
        _only(docs, "DaemonSet"), harness_version(), strict=True
    )
    assert validated == harness_version().rsplit(".", 1)[0]


def test_watch_registry_keeps_registry_dir_out_of_config(tmp_path: pathlib.Path) -> None:
    # The chart sets plugins.registry_dir (the --registry-dir arg) whichever registry it is.
    values = tmp_path / "values.yaml"
    values.write_text(
        "daemonset: {kubeletPlugins: {enabled: true, watchRegistry: true}}\n"
        "config: {plugins: {registry_dir: /var/lib/kubelet/plugins_registry}}\n"
    )
    answer = helm("template", "x", str(CHART), *IMAGE, "--values", str(values), check=False)
    assert answer.returncode != 0
    assert "config.plugins.registry_dir: set by the chart" in answer.stderr, answer.stderr
    values.write_text(
        "daemonset: {kubeletPlugins: {enabled: true, watchRegistry: true}}\n"
        "config: {plugins: {scan_interval: 2}}\n"
    )
    docs = template(values=[values])
    _, container = _pod(docs)
    assert _registry_arg(container) == "/var/lib/kubelet/plugins_registry"
    assert "registry_dir" not in _only(docs, "ConfigMap")["data"]["config.toml"]


def test_extra_volumes_and_mounts_pass_through() -> None:
    values = _full_values()["daemonset"]
    spec, container = _pod(_render("full"))
    assert values["extraVolumes"] and values["extraVolumeMounts"]
    assert spec["volumes"][-len(values["extraVolumes"]) :] == values["extraVolumes"]
    mounts = container["volumeMounts"]
    assert mounts[-len(values["extraVolumeMounts"]) :] == values["extraVolumeMounts"]


def test_the_monitoring_objects_carry_deploy_monitoring() -> None:
    docs = _render("full")
    daemonset = _only(docs, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    rule = _only(docs, "PrometheusRule")
    alerts = msgspec.yaml.decode(
        (REPO_ROOT / "deploy" / "monitoring" / "nodeagent-alerts.yaml").read_bytes()
    )
    assert rule["spec"] == alerts
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    dashboard = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]
    (configmap,) = dashboard
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(
        (REPO_ROOT / "deploy" / "monitoring" / "nodeagent-dashboard.json").read_text()
    )
    assert json.loads(configmap["data"]["nodeagent-dashboard.json"]) == shipped
    podmonitor = _only(docs, "PodMonitor")
    selector = podmonitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert podmonitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    service = _only(docs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    servicemonitor = _only(docs, "ServiceMonitor")
    assert (
        servicemonitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )
    # None of it by default.
    kinds = {d["kind"] for d in _render("default")}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule", "Service", "ConfigMap"}


def test_the_config_schema_is_the_agents() -> None:
    """values.schema.json checks config with the schema of the agent's own settings."""
    from nodeagent.service.config import Config

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["config"]["$ref"] == "#/$defs/Config"
    assert schema["$defs"] == msgspec.json.schema(Config)["$defs"]
    assert schema["$defs"]["Config"]["additionalProperties"] is False


def test_plain_install_is_the_default_namespace_and_account() -> None:
    assert (PLAIN.namespace, PLAIN.service_account, PLAIN.policy_prefix) == ("nodeagent",) * 3


def _controller(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "rollout-controller"
    ]
    return doc


def test_the_rollout_controller_is_installed_by_default_with_least_privilege() -> None:
    """On by default (an object with spec.rollout waits for it): a Deployment of 2 replicas (a
    rolling update never leaves none: the Lease passes to the other) running `nodeagent
    rollout-controller` from the agent's image as a non-root user, probed on /healthz, and RBAC
    that grants exactly what it needs: read NodeAgentConfigs and Nodes, write only the
    NodeAgentConfigs' status, Events, and the one Lease in its namespace."""
    docs = template()
    deployment = _controller(docs, "Deployment")
    assert deployment["metadata"]["name"] == "nodeagent-rollout-controller"
    assert deployment["metadata"]["namespace"] == "nodeagent"
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # Its pods are not the DaemonSet's: the selectors differ by the component label.
    daemonset = _only(docs, "DaemonSet")
    assert spec["selector"]["matchLabels"] != daemonset["spec"]["selector"]["matchLabels"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["args"] == [
        "rollout-controller",
        "--namespace=nodeagent",
        "--identity=$(POD_NAME)",
        "--lease-name=nodeagent-rollout-controller",  # the one Lease its Role may renew
        "--metrics-address=0.0.0.0:9466",
    ]
    # Every flag is one `nodeagent rollout-controller` takes.
    from nodeagent.cli import build_parser

    build_parser().parse_args([a.replace("$(POD_NAME)", "pod-1") for a in container["args"]])
    assert container["ports"] == [{"name": "metrics", "containerPort": 9466}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"]["memory"]
    account = pod["spec"]["serviceAccountName"]
    assert (
        account
        == "nodeagent-rollout-controller"
        != daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    )
    assert _controller(docs, "ServiceAccount")["metadata"]["name"] == account

    def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
        return {
            (group, resource, verb, ",".join(rule.get("resourceNames", [])))
            for rule in rules
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    cluster = grants(_controller(docs, "ClusterRole")["rules"])
    assert cluster == {
        ("nodeagent.io", "nodeagentconfigs", "get", ""),
        ("nodeagent.io", "nodeagentconfigs", "list", ""),
        ("nodeagent.io", "nodeagentconfigs", "watch", ""),
        ("nodeagent.io", "nodeagentconfigs/status", "update", ""),
        ("nodeagent.io", "nodeagentconfigs/status", "patch", ""),
        ("", "nodes", "get", ""),
        ("", "nodes", "list", ""),
        ("", "nodes", "watch", ""),
        ("", "events", "create", ""),
        ("", "events", "patch", ""),
    }
    role = _controller(docs, "Role")
    assert role["metadata"]["namespace"] == "nodeagent"
    lease = "nodeagent-rollout-controller"
    assert grants(role["rules"]) == {
        ("coordination.k8s.io", "leases", "create", ""),
        ("coordination.k8s.io", "leases", "get", lease),
        ("coordination.k8s.io", "leases", "update", lease),
    }
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = _controller(docs, kind)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": "nodeagent-rollout-controller",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": "nodeagent"}
        ]


def test_full_values_reach_the_rollout_controller() -> None:
    values = _full_values()["rolloutController"]
    docs = _render("full")
    deployment = _controller(docs, "Deployment")
    _, namespace = CHART_RELEASE
    assert deployment["metadata"]["namespace"] == namespace
    assert deployment["spec"]["replicas"] == values["replicas"]
    assert deployment["spec"]["strategy"] == values["strategy"]
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    for key in ("tolerations", "nodeSelector", "affinity", "priorityClassName"):
        assert spec[key] == values[key], key
    (container,) = spec["containers"]
    assert container["resources"] == values["resources"]
    assert container["ports"] == [{"name": "metrics", "containerPort": values["metricsPort"]}]
    assert f"--namespace={namespace}" in container["args"]
    assert container["args"][-len(values["extraArgs"]) :] == values["extraArgs"]
    from nodeagent.cli import build_parser

    build_parser().parse_args([a.replace("$(POD_NAME)", "pod-1") for a in container["args"]])
    assert container["env"][-len(values["extraEnv"]) :] == values["extraEnv"]
    assert pod["metadata"]["labels"]["example.com/tier"] == "control"
    annotations = pod["metadata"]["annotations"]
    assert annotations["example.com/note"] == "the rollout controller"
    assert annotations["prometheus.io/port"] == str(values["metricsPort"])


def test_the_rollout_controller_can_be_left_out() -> None:
    docs = template(sets=["rolloutController.enabled=false"])
    assert not [
        d
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "rollout-controller"
    ]
    assert _only(docs, "DaemonSet")
