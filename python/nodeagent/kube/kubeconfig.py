"""Connection settings from a kubeconfig file (YAML or JSON) or from the in-cluster service
account. Pure parsing: no network, no subprocess; credentials are fetched later by `auth`."""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import msgspec.yaml

from nodeagent.core.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class _Cluster(msgspec.Struct, kw_only=True):
    server: str = ""
    certificate_authority: str | None = msgspec.field(default=None, name="certificate-authority")
    certificate_authority_data: str | None = msgspec.field(
        default=None, name="certificate-authority-data"
    )
    insecure_skip_tls_verify: bool = msgspec.field(default=False, name="insecure-skip-tls-verify")
    tls_server_name: str | None = msgspec.field(default=None, name="tls-server-name")
    proxy_url: str | None = msgspec.field(default=None, name="proxy-url")


class _EnvVar(msgspec.Struct, kw_only=True):
    name: str
    value: str


class _Exec(msgspec.Struct, kw_only=True):
    command: str
    api_version: str = msgspec.field(name="apiVersion")
    args: list[str] | None = None
    env: list[_EnvVar] | None = None
    provide_cluster_info: bool = msgspec.field(default=False, name="provideClusterInfo")
    interactive_mode: str | None = msgspec.field(default=None, name="interactiveMode")
    install_hint: str | None = msgspec.field(default=None, name="installHint")


class _AuthProvider(msgspec.Struct, kw_only=True):
    name: str


class _User(msgspec.Struct, kw_only=True):
    client_certificate: str | None = msgspec.field(default=None, name="client-certificate")
    client_certificate_data: str | None = msgspec.field(
        default=None, name="client-certificate-data"
    )
    client_key: str | None = msgspec.field(default=None, name="client-key")
    client_key_data: str | None = msgspec.field(default=None, name="client-key-data")
    token: str | None = None
    token_file: str | None = msgspec.field(default=None, name="tokenFile")
    username: str | None = None
    password: str | None = None
    exec: _Exec | None = None
    auth_provider: _AuthProvider | None = msgspec.field(default=None, name="auth-provider")


class _Context(msgspec.Struct, kw_only=True):
    cluster: str
    user: str = ""
    namespace: str | None = None


class _NamedCluster(msgspec.Struct, kw_only=True):
    name: str
    cluster: _Cluster


class _NamedUser(msgspec.Struct, kw_only=True):
    name: str
    user: _User = msgspec.field(default_factory=_User)


class _NamedContext(msgspec.Struct, kw_only=True):
    name: str
    context: _Context


class _KubeconfigFile(msgspec.Struct, kw_only=True):
    clusters: list[_NamedCluster] | None = None
    users: list[_NamedUser] | None = None
    contexts: list[_NamedContext] | None = None
    current_context: str = msgspec.field(default="", name="current-context")


@dataclass(frozen=True, slots=True)
class ExecConfig:
    """A ``client.authentication.k8s.io`` exec credential plugin."""

    command: str
    api_version: str
    args: tuple[str, ...] = ()
    # Left out of repr (like the token and key below): a repr in a log or traceback must not
    # carry credentials.
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    provide_cluster_info: bool = False
    install_hint: str | None = None


EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything needed to connect and authenticate; file paths are absolute."""

    server: str
    ca_data: bytes | None = None
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = field(default=None, repr=False)
    client_cert_file: str | None = None
    client_key_file: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    exec: ExecConfig | None = None
    namespace: str = "default"
    source: str = field(default="", compare=False)


def _b64(fieldname: str, value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(fieldname, value[:20] + "...", f"not valid base64 ({exc})") from None


def _abs(base: Path, value: str | None) -> str | None:
    if not value:
        return None
    p = Path(os.path.expanduser(value))
    return str(p if p.is_absolute() else base / p)


def parse_kubeconfig(data: bytes, *, path: str, context: str | None = None) -> ClusterConfig:
    """Parse kubeconfig text (YAML or JSON); relative file paths resolve against ``path``'s dir.

    Raises `ConfigError` naming the kubeconfig field that is missing or invalid.
    """
    try:
        if data.lstrip().startswith(b"{"):
            doc = msgspec.json.decode(data, type=_KubeconfigFile)
        else:
            doc = msgspec.yaml.decode(data, type=_KubeconfigFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError("kubeconfig", path, f"not a valid kubeconfig: {exc}") from None
    ctx_name = context or doc.current_context
    if not ctx_name:
        raise ConfigError("context", path, "no context given and no current-context set")
    contexts = {c.name: c.context for c in doc.contexts or []}
    if ctx_name not in contexts:
        raise ConfigError("context", ctx_name, f"no such context in {path}")
    ctx = contexts[ctx_name]
    clusters = {c.name: c.cluster for c in doc.clusters or []}
    if ctx.cluster not in clusters:
        raise ConfigError(
            f"contexts[{ctx_name}].cluster", ctx.cluster, f"no such cluster in {path}"
        )
    cluster = clusters[ctx.cluster]
    users = {u.name: u.user for u in doc.users or []}
    if ctx.user and ctx.user not in users:
        raise ConfigError(f"contexts[{ctx_name}].user", ctx.user, f"no such user in {path}")
    user = users.get(ctx.user, _User())
    where = f"clusters[{ctx.cluster}]"
    if not cluster.server.startswith(("https://", "http://")):
        raise ConfigError(f"{where}.server", cluster.server, "must be an http(s):// URL")
    if cluster.proxy_url:
        raise ConfigError(f"{where}.proxy-url", cluster.proxy_url, "proxies are not supported")
    uwhere = f"users[{ctx.user}]"
    if user.auth_provider is not None:
        raise ConfigError(
            f"{uwhere}.auth-provider",
            user.auth_provider.name,
            "auth-provider plugins are not supported; use an exec plugin",
        )
    if user.username or user.password:
        raise ConfigError(f"{uwhere}.username", user.username, "basic auth is not supported")
    base = Path(path).resolve().parent
    exec_cfg = None
    if user.exec is not None:
        if user.exec.api_version not in EXEC_API_VERSIONS:
            raise ConfigError(
                f"{uwhere}.exec.apiVersion",
                user.exec.api_version,
                f"must be one of {', '.join(EXEC_API_VERSIONS)}",
            )
        command = user.exec.command
        # client-go resolves a command with a path separator against the kubeconfig's dir.
        if os.sep in command and not os.path.isabs(command):
            command = str(base / command)
        exec_cfg = ExecConfig(
            command=command,
            api_version=user.exec.api_version,
            args=tuple(user.exec.args or ()),
            env=tuple((e.name, e.value) for e in user.exec.env or ()),
            provide_cluster_info=user.exec.provide_cluster_info,
            install_hint=user.exec.install_hint,
        )
    cert_data = user.client_certificate_data
    key_data = user.client_key_data
    cert_file = _abs(base, user.client_certificate)
    key_file = _abs(base, user.client_key)
    if bool(cert_data or cert_file) != bool(key_data or key_file):
        raise ConfigError(
            f"{uwhere}.client-certificate", cert_file or "(data)", "needs a client key too"
        )
    return ClusterConfig(
        server=cluster.server.rstrip("/"),
        ca_data=_b64(f"{where}.certificate-authority-data", cluster.certificate_authority_data)
        if cluster.certificate_authority_data
        else None,
        ca_file=_abs(base, cluster.certificate_authority),
        insecure_skip_tls_verify=cluster.insecure_skip_tls_verify,
        tls_server_name=cluster.tls_server_name or None,
        client_cert_data=_b64(f"{uwhere}.client-certificate-data", cert_data)
        if cert_data
        else None,
        client_key_data=_b64(f"{uwhere}.client-key-data", key_data) if key_data else None,
        client_cert_file=cert_file,
        client_key_file=key_file,
        token=user.token or None,
        token_file=_abs(base, user.token_file),
        exec=exec_cfg,
        namespace=ctx.namespace or "default",
        source=path,
    )


def load_kubeconfig(path: str, context: str | None = None) -> ClusterConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("kubeconfig", path, f"cannot read: {exc.strerror}") from None
    return parse_kubeconfig(data, path=path, context=context)


def in_cluster_available(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and bool(env.get("KUBERNETES_SERVICE_PORT"))


def in_cluster_config(
    environ: dict[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The pod's service account: the token file is re-read by the client, never cached forever."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("KUBERNETES_SERVICE_HOST", host, "not running in a pod")
    token_file = sa_dir / "token"
    if not token_file.is_file():
        raise ConfigError("in_cluster", str(token_file), "service account token file missing")
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.is_file() else "default"
    ca_file = sa_dir / "ca.crt"
    return ClusterConfig(
        server=f"https://{host}:{port}",
        ca_file=str(ca_file) if ca_file.is_file() else None,
        token_file=str(token_file),
        namespace=namespace,
        source="in-cluster",
    )
