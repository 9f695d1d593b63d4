from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.kube import KubeClient, KubeSettings, load_client
from nodeagent.kube.kubeconfig import in_cluster_config, load_kubeconfig, parse_kubeconfig

B64 = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n").decode()

YAML = f"""
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443/
    certificate-authority: certs/ca.crt
    tls-server-name: api.internal
- name: dev
  cluster:
    server: https://dev.example:6443
    certificate-authority-data: {B64}
    insecure-skip-tls-verify: false
users:
- name: kubelet
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
- name: dev-user
  user:
    token: abc123
- name: sa
  user:
    tokenFile: tokens/sa
- name: cloud
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: ./bin/get-token
      args: ["--cluster", "prod"]
      env:
      - name: REGION
        value: eu
      provideClusterInfo: true
contexts:
- name: dev
  context: {{cluster: dev, user: dev-user, namespace: team}}
- name: node
  context: {{cluster: prod, user: kubelet}}
- name: sa
  context: {{cluster: prod, user: sa}}
- name: cloud
  context: {{cluster: prod, user: cloud}}
"""


def test_yaml_current_context(tmp_path: Path) -> None:
    cfg = parse_kubeconfig(YAML.encode(), path=str(tmp_path / "config"))
    assert cfg.server == "https://dev.example:6443"
    assert cfg.ca_data == b"-----BEGIN CERTIFICATE-----\nx\n"
    assert cfg.token == "abc123" and cfg.namespace == "team"
    assert not cfg.insecure_skip_tls_verify and cfg.exec is None


def test_explicit_contexts_and_relative_paths(tmp_path: Path) -> None:
    path = str(tmp_path / "config")
    node = parse_kubeconfig(YAML.encode(), path=path, context="node")
    assert node.server == "https://prod.example:6443"  # trailing slash dropped
    assert node.ca_file == str(tmp_path / "certs/ca.crt")
    assert node.tls_server_name == "api.internal"
    assert node.client_cert_file == node.client_key_file
    assert node.client_cert_file == "/var/lib/kubelet/pki/kubelet-client-current.pem"
    assert node.namespace == "default"
    sa = parse_kubeconfig(YAML.encode(), path=path, context="sa")
    assert sa.token_file == str(tmp_path / "tokens/sa")
    cloud = parse_kubeconfig(YAML.encode(), path=path, context="cloud")
    assert cloud.exec is not None
    assert cloud.exec.command == str(tmp_path / "bin/get-token")
    assert cloud.exec.args == ("--cluster", "prod")
    assert cloud.exec.env == (("REGION", "eu"),)
    assert cloud.exec.api_version == "client.authentication.k8s.io/v1beta1"
    assert cloud.exec.provide_cluster_info


def test_json_kubeconfig(tmp_path: Path) -> None:
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": "https://1.2.3.4"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    cfg = load_kubeconfig(str(path))
    assert (cfg.server, cfg.token) == ("https://1.2.3.4", "t")


@pytest.mark.parametrize(
    ("text", "context", "field", "rule"),
    [
        ("clusters: [", None, "kubeconfig", "not a valid kubeconfig"),
        ("clusters: []", None, "context", "no current-context"),
        (YAML, "nope", "context", "no such context"),
        (
            YAML.replace("cluster: dev, user: dev-user", "cluster: gone, user: dev-user"),
            None,
            "contexts[dev].cluster",
            "no such cluster",
        ),
        (
            YAML.replace("https://dev.example:6443", "dev.example"),
            None,
            "clusters[dev].server",
            "http(s)://",
        ),
        (
            YAML.replace(B64, "not_base64$"),
            None,
            "clusters[dev].certificate-authority-data",
            "base64",
        ),
        (
            YAML.replace(
                "client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1alpha1"
            ),
            "cloud",
            "users[cloud].exec.apiVersion",
            "must be one of",
        ),
        (
            YAML.replace("    token: abc123", "    auth-provider: {name: gcp}"),
            None,
            "users[dev-user].auth-provider",
            "not supported",
        ),
        (
            YAML.replace("    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n", ""),
            "node",
            "users[kubelet].client-certificate",
            "needs a client key",
        ),
    ],
)
def test_invalid_kubeconfig_names_the_field(
    tmp_path: Path, text: str, context: str | None, field: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_kubeconfig(text.encode(), path=str(tmp_path / "config"), context=context)
    assert exc.value.field == field
    assert rule in exc.value.rule


def test_unreadable_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_kubeconfig(str(tmp_path / "missing"))
    assert exc.value.field == "kubeconfig" and "cannot read" in exc.value.rule


def _sa_dir(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token-1\n")
    (sa / "ca.crt").write_text("ca")
    (sa / "namespace").write_text("agents\n")
    return sa


def test_in_cluster_config(tmp_path: Path) -> None:
    sa = _sa_dir(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster_config(env, sa)
    assert cfg.server == "https://10.0.0.1:443"
    assert cfg.token_file == str(sa / "token") and cfg.token is None
    assert cfg.ca_file == str(sa / "ca.crt") and cfg.namespace == "agents"
    v6 = in_cluster_config(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, sa
    )
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(ConfigError):
        in_cluster_config({}, sa)


def test_load_client_modes(tmp_path: Path) -> None:
    # Neither a kubeconfig nor a pod: standalone.
    assert load_client(KubeSettings(), environ={}) is None
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    sa = _sa_dir(tmp_path)
    settings = KubeSettings(qps=5, burst=7, watch_inactivity_timeout=12)
    client = load_client(settings, environ=env, sa_dir=sa)
    assert isinstance(client, KubeClient)
    assert client.config.server == "https://10.0.0.1:443"
    assert (client.limiter.qps, client.limiter.burst) == (5, 7)
    assert client.watch_options.inactivity_timeout == 12  # what every watch through it uses
    assert load_client(KubeSettings(in_cluster="never"), environ=env, sa_dir=sa) is None
    with pytest.raises(ConfigError) as exc:
        load_client(KubeSettings(in_cluster="always"), environ={}, sa_dir=sa)
    assert exc.value.field == "kube.in_cluster"
    path = tmp_path / "config"
    path.write_text(YAML)
    client = load_client(KubeSettings(kubeconfig=str(path), context="sa"), environ=env)
    assert client is not None and client.config.token_file == str(tmp_path / "tokens/sa")


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (KubeSettings(qps=0), "kube.qps"),
        (KubeSettings(burst=0), "kube.burst"),
        (KubeSettings(request_timeout=-1), "kube.request_timeout"),
        (KubeSettings(watch_inactivity_timeout=1), "kube.watch_inactivity_timeout"),
        (KubeSettings(max_attempts=0), "kube.max_attempts"),
        (KubeSettings(kubeconfig=""), "kube.kubeconfig"),
        (KubeSettings(kubeconfig="/x", in_cluster="always"), "kube.in_cluster"),
    ],
)
def test_settings_validation_names_the_field(settings: KubeSettings, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        settings.validate()
    assert exc.value.field == field


def test_settings_from_toml_rejects_unknown_keys() -> None:
    import msgspec

    ok = msgspec.toml.decode(b'kubeconfig = "/etc/kubeconfig"\nqps = 5.0', type=KubeSettings)
    assert ok.kubeconfig == "/etc/kubeconfig" and ok.qps == 5.0 and ok.burst == 40
    with pytest.raises(msgspec.ValidationError, match="qsp"):
        msgspec.toml.decode(b"qsp = 5.0", type=KubeSettings)
