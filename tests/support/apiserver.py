"""A real kube-apiserver (+ embedded etcd) on loopback, for integration tests.

Standard library only. The Go side lives in ``tests/harness/apiserver`` (one binary,
``harness``, with the subcommands ``certs``, ``etcd`` and ``apiserver``); it
is built by ``tests/harness/apiserver/build.sh`` into a cache directory keyed by the
hash of its sources, so only the first run on a machine pays for the build.

Typical use from a conftest::

    from tests.support.apiserver import apiserver_fixture
    apiserver = apiserver_fixture(scope="session")

or directly::

    srv = start_apiserver(tmp_path)
    try:
        srv.request("GET", "/api/v1/nodes", identity="node-a")
    finally:
        srv.close()

Releases: every directory ``tests/harness/apiserver/releases/<major.minor>`` is one
Kubernetes release the harness builds (``releases()``, newest first). A test
runs on ``NODEAGENT_KUBE_RELEASE`` (default: the newest) unless it asks for a
release (``start_apiserver(tmp, release="1.35")``); ``srv.release`` and
``srv.version`` say which one it got.

Feature-gate lanes: ``NODEAGENT_KUBE_GATES`` (or ``gates=``) is ``default``
(the release's defaults) or ``all-dra``: every DRA feature gate the release
knows and lets a user change (alpha and beta; GA/locked gates are never
passed), with their dependencies, and every resource.k8s.io API version. Tests
ask the running server which gates are on with ``srv.feature_enabled(name)``.

Environment:
    NODEAGENT_KUBE_RELEASE     release of the default server: 1.37, 1.36, ...
    NODEAGENT_KUBE_GATES       feature-gate lane of the default server: default | all-dra
    NODEAGENT_HARNESS_BIN      use this harness binary (for NODEAGENT_KUBE_RELEASE's release)
                               instead of building one
    NODEAGENT_HARNESS_TIMEOUT  seconds to wait for /readyz (default 120)
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from tests.support.gobuild import GoBinary

__all__ = [
    "GATE_LANES",
    "ApiServer",
    "ApiServerError",
    "Feature",
    "HarnessBuildError",
    "HarnessFeatures",
    "apiserver_fixture",
    "build_harness",
    "dra_gates",
    "free_ports",
    "harness_features",
    "newest_release",
    "release_version",
    "releases",
    "selected_gates",
    "selected_release",
    "start_apiserver",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "tests" / "harness" / "apiserver" / "build.sh"
RELEASES_DIR = REPO_ROOT / "tests" / "harness" / "apiserver" / "releases"
RELEASE_ENV = "NODEAGENT_KUBE_RELEASE"
GATES_ENV = "NODEAGENT_KUBE_GATES"
GATE_LANES = ("default", "all-dra")

DEFAULT_NODES = ("node-a", "node-b")
READY_TIMEOUT = float(os.environ.get("NODEAGENT_HARNESS_TIMEOUT", "120"))
STOP_TIMEOUT = 30.0
WATCH_DRAIN = "5s"  # the longest a stop waits for the watches the server ended to drain


class HarnessBuildError(RuntimeError):
    """build.sh failed; the message carries its output."""


class ApiServerError(RuntimeError):
    """etcd or kube-apiserver did not come up (message carries the log tail)."""


# --------------------------------------------------------------------------
# building


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def releases() -> tuple[str, ...]:
    """The Kubernetes releases the harness builds ("1.37", "1.36", ...), newest first."""
    found = [
        d.name
        for d in RELEASES_DIR.iterdir()
        if re.fullmatch(r"\d+\.\d+", d.name) and (d / "go.mod").is_file()
    ]
    return tuple(sorted(found, key=_release_key, reverse=True))


def newest_release() -> str:
    return releases()[0]


def _normalize_release(release: str) -> str:
    """ "1.37", "v1.37" or "v1.37.2" -> "1.37" (a patch must be the pinned one)."""
    r = release.strip().removeprefix("v")
    m = re.fullmatch(r"(\d+\.\d+)(?:\.(\d+))?", r)
    if m is None or m.group(1) not in releases():
        raise ValueError(
            f"unknown Kubernetes release {release!r}; the harness builds {', '.join(releases())}"
        )
    if m.group(2) is not None and release_version(m.group(1)) != f"v{r}":
        raise ValueError(
            f"release {m.group(1)} is pinned to {release_version(m.group(1))}, not v{r} "
            "(tests/harness/apiserver/releases/pin.sh moves it)"
        )
    return m.group(1)


def selected_release() -> str:
    """The release of the default server: $NODEAGENT_KUBE_RELEASE, else the newest."""
    env = os.environ.get(RELEASE_ENV, "").strip()
    return _normalize_release(env) if env else newest_release()


def selected_gates() -> str:
    """The feature-gate lane of the default server: $NODEAGENT_KUBE_GATES, else "default"."""
    lane = os.environ.get(GATES_ENV, "").strip() or "default"
    if lane not in GATE_LANES:
        raise ValueError(f"{GATES_ENV}={lane!r}: expected one of {', '.join(GATE_LANES)}")
    return lane


@functools.cache
def release_version(release: str) -> str:
    """The Kubernetes version a release is pinned to ("1.37" -> "v1.37.2"), from its go.mod."""
    text = (RELEASES_DIR / release / "go.mod").read_text()
    m = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", text, re.MULTILINE)
    if m is None:
        raise HarnessBuildError(f"no k8s.io/kubernetes version in {RELEASES_DIR / release}/go.mod")
    return m.group(1)


_binaries: dict[str, GoBinary] = {}
_binaries_lock = threading.Lock()


def build_harness(release: str | None = None) -> pathlib.Path:
    """Run tests/harness/apiserver/build.sh for ``release`` (default: :func:`selected_release`; a
    no-op when cached); return the binary path.

    The first build of a release compiles kube-apiserver and etcd (minutes); later calls
    only hash the sources. $NODEAGENT_HARNESS_BIN stands in for the selected release only.
    """
    r = _normalize_release(release) if release else selected_release()
    with _binaries_lock:
        binary = _binaries.get(r)
        if binary is None:
            override = "NODEAGENT_HARNESS_BIN" if r == selected_release() else None
            binary = GoBinary(BUILD_SH, override, HarnessBuildError, args=(r,))
            _binaries[r] = binary
    return binary.path()


@dataclasses.dataclass(frozen=True)
class Feature:
    """One kube-apiserver feature gate at the release's own version (``harness features``)."""

    name: str
    default: bool
    pre_release: str  # "ALPHA", "BETA", "" (GA) or "DEPRECATED"
    locked: bool
    depends_on: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class HarnessFeatures:
    features: Mapping[str, Feature]
    resource_versions: tuple[str, ...]  # resource.k8s.io versions, preferred first
    # Versions of the groups a DRA gate's dependencies use (resource.k8s.io, scheduling.k8s.io).
    api_versions: Mapping[str, tuple[str, ...]]


_features: dict[pathlib.Path, HarnessFeatures] = {}


def harness_features(release: str | None = None) -> HarnessFeatures:
    """Every feature gate of ``release``'s kube-apiserver and its resource.k8s.io versions,
    asked from the binary itself (exact per release, no parsing of Go sources)."""
    binary = build_harness(release)
    cached = _features.get(binary)
    if cached is not None:
        return cached
    proc = subprocess.run(
        [str(binary), "features"], stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise HarnessBuildError(f"{binary} features failed ({proc.returncode}):\n{proc.stderr}")
    doc = json.loads(proc.stdout)
    feats = {
        f["name"]: Feature(
            name=f["name"],
            default=bool(f["default"]),
            pre_release=f["preRelease"],
            locked=bool(f["locked"]),
            depends_on=tuple(f.get("dependsOn") or ()),
        )
        for f in doc["features"]
    }
    api_versions = {g: tuple(v) for g, v in (doc.get("apiVersions") or {}).items()}
    out = HarnessFeatures(feats, tuple(doc["resourceVersions"]), api_versions)
    _features[binary] = out
    return out


def _is_dra_gate(name: str) -> bool:
    return name.startswith("DRA") or name == "DynamicResourceAllocation"


def dra_gates(release: str | None = None) -> dict[str, bool]:
    """The gates of the ``all-dra`` lane: every DRA gate of the release a user may change
    (alpha or beta, not locked, not deprecated), plus the gates they depend on, all true."""
    feats = harness_features(release).features
    wanted = [
        f.name
        for f in feats.values()
        if _is_dra_gate(f.name) and not f.locked and f.pre_release in ("ALPHA", "BETA")
    ]
    out: dict[str, bool] = {}
    todo = list(wanted)
    while todo:
        name = todo.pop()
        f = feats.get(name)
        if name in out or f is None or f.locked:
            continue
        out[name] = True
        todo.extend(f.depends_on)
    return dict(sorted(out.items()))


def _gate_args(
    release: str, lane: str, feature_gates: Mapping[str, bool]
) -> tuple[list[str], dict[str, bool]]:
    """kube-apiserver flags for a lane plus explicit gates, and the gates they set.

    A gate locked to the asked value is dropped (passing it is an error on some releases); a
    gate locked to the other value, or unknown to the release, raises ValueError."""
    gates: dict[str, bool] = {}
    if lane == "all-dra":
        gates.update(dra_gates(release))
    elif lane != "default":
        raise ValueError(f"gates={lane!r}: expected one of {', '.join(GATE_LANES)}")
    if not gates and not feature_gates:
        return [], {}
    hf = harness_features(release)
    for name, value in feature_gates.items():
        f = hf.features.get(name)
        if f is None:
            raise ValueError(f"kube-apiserver {release} has no feature gate {name!r}")
        if f.locked and f.default != value:
            raise ValueError(f"feature gate {name} is locked to {f.default} in {release}")
        gates[name] = value
    gates = {n: v for n, v in gates.items() if not hf.features[n].locked}
    args = []
    if gates:
        args.append(
            "--feature-gates=" + ",".join(f"{n}={str(v).lower()}" for n, v in gates.items())
        )
    if lane == "all-dra":
        # Alpha/beta API versions are off unless asked for (DeviceTaintRule, pool status, ...).
        apis = [f"resource.k8s.io/{v}" for v in hf.resource_versions]
        if gates.get("GenericWorkload"):
            # Its Workload/PodGroup informers keep /readyz failing (1.36) while the API is off.
            apis += [f"scheduling.k8s.io/{v}" for v in hf.api_versions.get("scheduling.k8s.io", ())]
        args.append("--runtime-config=" + ",".join(f"{api}=true" for api in apis))
    return args, gates


# --------------------------------------------------------------------------
# helpers


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: pathlib.Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.splitlines()[-lines:])


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class _Proc:
    """A harness subprocess whose stdout+stderr go to a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: pathlib.Path) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as f:
            f.write(f"\n===== {time.strftime('%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            f.flush()
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so
            # only use it from the main thread (trio worker threads come and go).
            on_main = threading.current_thread() is threading.main_thread()
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig if on_main else None,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait up to timeout, then SIGKILL. Returns the exit code."""
        p = self.popen
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            except ProcessLookupError:
                pass
        return p.returncode

    def kill(self) -> None:
        p = self.popen
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


_live: weakref.WeakSet[ApiServer] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for srv in list(_live):
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            srv.close()


# --------------------------------------------------------------------------
# the server


class ApiServer:
    """A running kube-apiserver + etcd pair. Build with :func:`start_apiserver`.

    Attributes:
        url: ``https://127.0.0.1:<port>``
        dir: directory with certs, tokens, kubeconfigs, etcd data and logs
        etcd_url: ``http://127.0.0.1:<port>`` (etcd client URL + JSON gateway)
        version: gitVersion from /version, e.g. ``v1.37.2``
        release: the Kubernetes release, e.g. ``1.37``
        gates: the feature-gate lane, ``default`` or ``all-dra``
        set_gates: the feature gates passed to kube-apiserver (lane and explicit ones)
        nodes: node names that have client certs / kubeconfigs
        apiserver_log, etcd_log: log files (appended across restarts)
    """

    def __init__(
        self,
        workdir: pathlib.Path,
        binary: pathlib.Path,
        nodes: Iterable[str] = DEFAULT_NODES,
        extra_args: Sequence[str] = (),
        *,
        release: str | None = None,
        gates: str = "default",
        set_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.release = release or selected_release()
        self.gates = gates
        self.set_gates = dict(set_gates or {})
        self.dir = pathlib.Path(workdir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.binary = pathlib.Path(binary)
        self.nodes = tuple(nodes)
        self.extra_args = tuple(extra_args)
        self.port, self.etcd_port, self.etcd_peer_port = free_ports(3)
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.apiserver_log = self.dir / "apiserver.log"
        self.etcd_log = self.dir / "etcd.log"
        self.version = ""
        self.startup_seconds = 0.0  # of the last start_apiserver()
        self._enabled: dict[str, bool] | None = None
        self._etcd: _Proc | None = None
        self._apiserver: _Proc | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}
        self._closed = False
        _live.add(self)

    # -- identities -------------------------------------------------------

    def kubeconfig(self, identity: str) -> pathlib.Path:
        """Path of the kubeconfig for "admin", a node name ("node-a", ...) or "token"."""
        p = self.dir / f"kubeconfig-{identity}"
        if not p.exists():
            raise KeyError(f"no kubeconfig for identity {identity!r} in {self.dir}")
        return p

    def token(self, name: str) -> str:
        """Static bearer token: "admin" (user admin-token), "token-a"/"token-b" (both user
        token-user); all in group system:masters."""
        fname = "token-admin" if name == "admin" else name
        p = self.dir / fname
        if name not in ("admin", "token-a", "token-b") or not p.exists():
            raise KeyError(f"no token named {name!r}")
        return p.read_text().strip()

    def cert_files(self, identity: str) -> tuple[pathlib.Path, pathlib.Path]:
        """(cert, key) PEM paths of a client-cert identity ("admin", "node-a", ...)."""
        crt, key = self.dir / f"{identity}.crt", self.dir / f"{identity}.key"
        if identity in ("ca", "apiserver") or not crt.exists():
            raise KeyError(f"no client certificate for {identity!r}")
        return crt, key

    @property
    def ca_file(self) -> pathlib.Path:
        return self.dir / "ca.crt"

    def issue_client_cert(
        self, node: str, out_dir: pathlib.Path
    ) -> tuple[pathlib.Path, pathlib.Path]:
        """A new certificate and key for ``system:node:<node>`` from the harness CA, written
        into ``out_dir`` (a rotated identity: the server accepts it beside the first one).
        Returns (cert, key) paths."""
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("ca.crt", "ca.key", "token-a"):  # the harness issues what is missing
            (out / name).write_bytes((self.dir / name).read_bytes())
        argv = [str(self.binary), "certs", "--dir", str(out), "--nodes", node]
        argv += ["--server", self.url]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ApiServerError(f"harness certs failed ({proc.returncode}):\n{proc.stderr}")
        (out / "ca.key").unlink()
        return out / f"{node}.crt", out / f"{node}.key"

    def write_kubeconfig(
        self, path: pathlib.Path, user: Mapping[str, Any], server: str | None = None
    ) -> pathlib.Path:
        """Write a kubeconfig (JSON) for this server's CA and ``user`` (kubeconfig user fields:
        ``tokenFile``, ``client-certificate``/``client-key`` paths, ...), pointing at ``server``
        (default: this apiserver; a proxy in front of it, say)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority": str(self.ca_file),
                    },
                }
            ],
            "users": [{"name": "u", "user": dict(user)}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
        path.write_text(json.dumps(doc))
        return path

    def ssl_context(self, identity: str | None = "admin") -> ssl.SSLContext:
        """Client TLS context trusting the harness CA, presenting identity's cert
        (None: no client cert, e.g. for token auth)."""
        key = identity or ""
        ctx = self._ssl.get(key)
        if ctx is None:
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            if identity:
                crt, k = self.cert_files(identity)
                ctx.load_cert_chain(str(crt), str(k))
            self._ssl[key] = ctx
        return ctx

    # -- HTTP -------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        identity: str | None = "admin",
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, Any]:
        """One API call. Returns (status, decoded JSON or text); never raises on
        HTTP errors. Authenticates with identity's client cert, or with the bearer
        token if token is given (then no client cert is sent)."""
        data = None
        hdrs = {"Accept": "application/json"}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            ctype = "application/json"
            if method.upper() == "PATCH":
                ctype = "application/merge-patch+json"
            hdrs["Content-Type"] = ctype
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
            identity = None
        hdrs.update(headers or {})
        req = urllib.request.Request(
            self.url + path, data=data, method=method.upper(), headers=hdrs
        )
        ctx = self.ssl_context(identity)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    # -- lifecycle --------------------------------------------------------

    def _run_certs(self) -> None:
        argv = [
            str(self.binary),
            "certs",
            "--dir",
            str(self.dir),
            "--nodes",
            ",".join(self.nodes),
            "--server",
            self.url,
        ]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ApiServerError(f"harness certs failed ({proc.returncode}):\n{proc.stderr}")

    def start_etcd(self) -> None:
        if self._etcd is not None and self._etcd.alive():
            return
        self._etcd = _Proc(
            "etcd",
            [
                str(self.binary),
                "etcd",
                "--dir",
                str(self.dir),
                "--client-port",
                str(self.etcd_port),
                "--peer-port",
                str(self.etcd_peer_port),
            ],
            self.etcd_log,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if not self._etcd.alive():
                raise ApiServerError(
                    f"etcd exited with {self._etcd.popen.returncode}; "
                    f"{self.etcd_log} tail:\n{_tail(self.etcd_log)}"
                )
            try:
                self._etcd_post(
                    "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()}, timeout=2
                )
                return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self._etcd.kill()
                raise ApiServerError(
                    f"etcd not ready after {READY_TIMEOUT:.0f}s; tail:\n{_tail(self.etcd_log)}"
                )
            time.sleep(0.1)

    def start_apiserver(self) -> None:
        """Start kube-apiserver on self.port and wait for /readyz (as admin)."""
        if self._closed:
            raise ApiServerError("ApiServer is closed")
        if self._apiserver is not None and self._apiserver.alive():
            return
        t0 = time.monotonic()
        argv = [
            str(self.binary),
            "apiserver",
            "--dir",
            str(self.dir),
            "--etcd",
            self.etcd_url,
            "--port",
            str(self.port),
        ]
        # kube-apiserver's graceful shutdown ends open watches itself only with a grace period
        # for them; without one it holds them until STOP_TIMEOUT's SIGKILL (30 s for every stop
        # or restart under an agent). extra_args may set another (the last flag wins).
        argv += ["--", f"--shutdown-watch-termination-grace-period={WATCH_DRAIN}", *self.extra_args]
        self._apiserver = _Proc("apiserver", argv, self.apiserver_log)
        self._wait_ready(t0)
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + READY_TIMEOUT
        last = "no answer yet"
        assert self._apiserver is not None
        while True:
            if not self._apiserver.alive():
                raise ApiServerError(
                    f"kube-apiserver exited with {self._apiserver.popen.returncode} "
                    "before /readyz; "
                    f"{self.apiserver_log} tail:\n{_tail(self.apiserver_log)}"
                )
            try:
                status, body = self.request("GET", "/readyz", timeout=5)
                if status == 200:
                    break
                last = f"/readyz -> {status}: {str(body)[-1500:]}"
            except (OSError, urllib.error.URLError) as e:
                last = f"/readyz: {e}"
            if time.monotonic() > deadline:
                self._apiserver.kill()
                raise ApiServerError(
                    f"kube-apiserver not ready after {READY_TIMEOUT:.0f}s (last: {last}); "
                    f"{self.apiserver_log} tail:\n{_tail(self.apiserver_log)}"
                )
            time.sleep(0.1)
        status, body = self.request("GET", "/version")
        if status != 200 or not isinstance(body, dict):
            raise ApiServerError(f"/version -> {status}: {body}")
        self.version = body.get("gitVersion", "")
        if not self.version.startswith(f"v{self.release}."):
            self._apiserver.kill()
            raise ApiServerError(
                f"{self.binary} serves {self.version}, not release {self.release} "
                "(NODEAGENT_HARNESS_BIN of another release?)"
            )
        self._enabled = None

    # -- feature gates ----------------------------------------------------

    def enabled_features(self) -> dict[str, bool]:
        """Every feature gate of the running kube-apiserver and whether it is on, as the server
        itself reports it (its ``kubernetes_feature_enabled`` metric)."""
        if self._enabled is None:
            status, body = self.request("GET", "/metrics", headers={"Accept": "text/plain"})
            if status != 200 or not isinstance(body, str):
                raise ApiServerError(f"/metrics -> {status}: {str(body)[:500]}")
            pat = re.compile(r'^kubernetes_feature_enabled\{name="([^"]+)"[^}]*\}\s+(\S+)$')
            enabled = {}
            for line in body.splitlines():
                m = pat.match(line)
                if m:
                    enabled[m.group(1)] = float(m.group(2)) == 1.0
            if not enabled:
                raise ApiServerError("/metrics has no kubernetes_feature_enabled samples")
            self._enabled = enabled
        return dict(self._enabled)

    def feature_enabled(self, name: str) -> bool:
        """Whether feature gate ``name`` is on in the running server (False if the release does
        not know it): tests use it to know which gated fields a write keeps."""
        return self.enabled_features().get(name, False)

    def stop_apiserver(self) -> int | None:
        """SIGTERM kube-apiserver and wait for it to exit (SIGKILL after 30 s); its exit code
        (0: its graceful shutdown finished, open watches ended by the server; None: not running).
        etcd keeps running; the port is free until start_apiserver()."""
        code = None
        if self._apiserver is not None:
            code = self._apiserver.stop()
            self._apiserver = None
        return code

    def restart(self) -> None:
        """stop_apiserver() then start_apiserver(): same port, same etcd data."""
        self.stop_apiserver()
        self.start_apiserver()

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver (crash, no graceful shutdown)."""
        if self._apiserver is not None:
            self._apiserver.kill()
            self._apiserver = None

    @property
    def apiserver_pid(self) -> int | None:
        return (
            self._apiserver.pid if self._apiserver is not None and self._apiserver.alive() else None
        )

    def close(self) -> None:
        """Stop kube-apiserver, then etcd. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop_apiserver()
        finally:
            if self._etcd is not None:
                self._etcd.stop()
                self._etcd = None
            _live.discard(self)

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- etcd -------------------------------------------------------------

    def _etcd_post(self, path: str, body: Mapping[str, Any], timeout: float = 10) -> dict:
        req = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        """etcd's current revision (== the newest resourceVersion the apiserver can hand out)."""
        out = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        return int(out["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd to its current revision (physical); return that revision.

        After this, reads/watches that reach etcd with an older resourceVersion
        get 410 Gone. Note that kube-apiserver's watch cache keeps serving watches
        for cached resources from its own event window: use a resource without a
        watch cache (core/v1 events by default, or pass
        ``extra_args=["--watch-cache-sizes=<resource>#0"]``), or restart() after
        compact(), to see 410 on a watch.
        """
        rev = self.etcd_revision()
        try:
            self._etcd_post(
                "/v3/kv/compaction", {"revision": str(rev), "physical": True}, timeout=30
            )
        except urllib.error.HTTPError as e:
            msg = e.read().decode("utf-8", "replace")
            if "compacted" not in msg:  # already compacted at rev: fine
                raise ApiServerError(f"etcd compaction at {rev} failed: {e.code} {msg}") from None
        return rev


def start_apiserver(
    workdir: pathlib.Path,
    nodes: Iterable[str] = DEFAULT_NODES,
    extra_args: Sequence[str] = (),
    *,
    release: str | None = None,
    gates: str | None = None,
    feature_gates: Mapping[str, bool] | None = None,
) -> ApiServer:
    """Build the harness of ``release`` if needed, write certs/tokens/kubeconfigs into
    workdir, start etcd and kube-apiserver, and wait for /readyz (as admin).

    release: "1.37", "1.36", ... (default $NODEAGENT_KUBE_RELEASE, else the newest).
    gates: the feature-gate lane, "default" or "all-dra" (default $NODEAGENT_KUBE_GATES, else
    "default"). feature_gates: more gates to set (name -> bool; a gate locked to that value in
    the release is dropped, an unknown or contrary locked gate raises ValueError).
    extra_args are appended to kube-apiserver's flags (last occurrence wins; repeated
    --feature-gates and --runtime-config flags add up).
    Raises ApiServerError with the relevant log tail on failure or timeout.
    """
    r = _normalize_release(release) if release else selected_release()
    lane = gates if gates is not None else selected_gates()
    gate_args, set_gates = _gate_args(r, lane, dict(feature_gates or {}))
    binary = build_harness(r)
    srv = ApiServer(
        pathlib.Path(workdir),
        binary,
        nodes,
        [*gate_args, *extra_args],
        release=r,
        gates=lane,
        set_gates=set_gates,
    )
    try:
        srv._run_certs()
        srv.start_etcd()
        srv.start_apiserver()
    except BaseException:
        srv.close()
        raise
    return srv


def apiserver_fixture(
    scope: Literal["session", "package", "module", "class", "function"] = "session",
    name: str = "apiserver",
    nodes: Iterable[str] = DEFAULT_NODES,
    extra_args: Sequence[str] = (),
    *,
    release: str | None = None,
    gates: str | None = None,
    feature_gates: Mapping[str, bool] | None = None,
):
    """Return a pytest fixture (put it in a conftest) yielding a started ApiServer.

        from tests.support.apiserver import apiserver_fixture
        apiserver = apiserver_fixture(scope="session")

    The workdir comes from tmp_path_factory; the server is closed at teardown. release,
    gates and feature_gates as for :func:`start_apiserver` (release and lane default to the
    environment's at fixture set-up).
    """
    import pytest

    nodes = tuple(nodes)
    extra_args = tuple(extra_args)
    fgates = dict(feature_gates or {})

    @pytest.fixture(scope=scope, name=name)
    def _fixture(tmp_path_factory):
        srv = start_apiserver(
            tmp_path_factory.mktemp(name),
            nodes=nodes,
            extra_args=extra_args,
            release=release,
            gates=gates,
            feature_gates=fgates,
        )
        try:
            yield srv
        finally:
            srv.close()

    return _fixture
