"""A real Kubernetes node for end-to-end tests: an upstream kubelet and kube-scheduler of the
apiserver harness's release, on containerd and runc (docs/testing/real-node.md, which lists the
machine conditions this relies on). The test process runs in a network namespace of its own
(scripts/test-real-node starts pytest under ``unshare --net`` with lo up): the apiserver's
loopback, the node's address (a veth link) and the pods' bridge all live there, nothing in the
host's.

    srv = start_apiserver(tmp / "api", **real_node_apiserver_kwargs(tmp / "api"))
    with start_real_node(srv, tmp / "node") as node:
        node.load_images()
        ...  # pods without nodeName (the scheduler binds them); node.wait_pod_phase(...)

The kubelet and containerd (and its shims) run in a private mount namespace, so their mounts
(kubelet's root dir onto itself, container rootfs, network namespaces) never reach the host's;
inside it, the paths they hard-code (/var/lib/kubelet, /var/lib/cni, /var/log/pods,
/var/log/containers, /run/containerd, /run/netns) are bind mounts of directories under the work
dir. The kubelet's own directories (``kubelet_root``, its ``plugins_registry`` and ``plugins``)
and the CDI spec dir are plain directories under the work dir, seen the same from both
namespaces: a host process (a DRA driver, the agent) creates its sockets there and the kubelet
reaches them. ``run_on_node`` starts a process inside the namespace instead (close() kills it
with the node).

Builds: tests/harness/apiserver/build-node.sh (kubelet + scheduler, per release) and
tests/harness/realnode/build-runtime.sh (containerd, runc, busybox; installs the CNI plugins).

Environment:
    NODEAGENT_NODE_BIN     use this node binary (kubelet + scheduler) instead of building one
    NODEAGENT_RUNTIME_DIR  use this directory of runtime binaries instead of building them
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import select
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from tests.support import wait
from tests.support.apiserver import ApiServer, _pdeathsig, _Proc, _tail, free_ports
from tests.support.gobuild import GoBinary

__all__ = [
    "NODE_IP",
    "RealNode",
    "RealNodeError",
    "build_node_binary",
    "build_runtime",
    "real_node_apiserver_kwargs",
    "start_real_node",
    "until",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_NODE_SH = REPO_ROOT / "tests" / "harness" / "apiserver" / "build-node.sh"
BUILD_RUNTIME_SH = REPO_ROOT / "tests" / "harness" / "realnode" / "build-runtime.sh"
CNI_BIN_DIR = pathlib.Path("/usr/lib/cni")
# The kubelet's address and the Node's InternalIP, on a veth link the node adds to the test's
# network namespace. A loopback --node-ip leaves the Node without addresses ("nodeIP can't be
# loopback address"), so kube-apiserver could not reach the kubelet (pod logs, exec); and the
# machines' network rule allows no address but loopback in the host's own namespace: the tests
# run in a network namespace of their own (scripts/test-real-node), where this address, the
# apiserver's loopback and the pods' bridge all live.
NODE_IP = "10.244.76.1"
NODE_LINK = "realnode0"
POD_SUBNET = "10.244.77.0/24"
START_TIMEOUT = 60.0
# Paths the kubelet, containerd or the CNI plugins use whatever their configuration says: inside
# the node's mount namespace, each is a bind mount of <workdir>/hostpaths/<path>.
HARDCODED_PATHS = (
    "/var/lib/kubelet",  # device-plugins/kubelet.sock
    "/var/lib/cni",  # the CNI result cache
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",  # the shims' sockets (/run/containerd/s)
    "/run/netns",  # the pods' network namespaces (cni-*)
)
# What the node lifecycle controller removes once a node is Ready (the harness runs none).
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
CGROUP_PARENT = "k8s.io"  # containerd's cgroup of the containers (cgroupsPerQOS: false)

T = TypeVar("T")


class RealNodeError(RuntimeError):
    """A build failed, a component exited, or a wait timed out (the message says what was last
    seen and carries the relevant log tails)."""


def _gate_flag(gates: Mapping[str, bool]) -> list[str]:
    if not gates:
        return []
    return [
        "--feature-gates=" + ",".join(f"{n}={str(v).lower()}" for n, v in sorted(gates.items()))
    ]


class _ComponentExited(BaseException):
    """A component exited during a wait: a BaseException, so that wait.until (which retries on
    Exception, a check's passing error) stops at once instead of polling a dead node."""


def until(
    check: Callable[[], tuple[T | None, str]],
    what: str,
    timeout: float,
    *,
    interval: float = 0.2,
    died: Callable[[], str | None] = lambda: None,
) -> T:
    """tests/support/wait.py's ``until`` (the tests' one wait helper) for the node's waits:
    poll ``check`` until it gives a value (not None) and return it. ``check`` returns (value,
    what it saw); on timeout RealNodeError says ``what`` and the last thing seen. ``died`` says
    why waiting is pointless (a component exited, with its log tail), or None."""
    seen = ["nothing yet"]

    def probe() -> T | None:
        dead = died()
        if dead is not None:
            raise _ComponentExited(dead)
        try:
            value, seen[0] = check()
        except Exception as e:
            seen[0] = f"{type(e).__name__}: {e}"
            raise
        return value

    try:
        return wait.until(probe, what, timeout=timeout, interval=interval)
    except wait.WaitTimeout:
        raise RealNodeError(f"{what}: not within {timeout:g} s; last seen: {seen[0]}") from None
    except _ComponentExited as e:
        raise RealNodeError(f"{what}: {e} (last seen: {seen[0]})") from None


_node_bins: dict[str, GoBinary] = {}
_runtime = GoBinary(BUILD_RUNTIME_SH, "NODEAGENT_RUNTIME_DIR", RealNodeError)
_build_lock = threading.Lock()


def build_node_binary(release: str) -> pathlib.Path:
    """tests/harness/apiserver/build-node.sh for ``release`` ("1.37"; a no-op when cached): the
    binary with the ``kubelet`` and ``scheduler`` subcommands."""
    with _build_lock:
        binary = _node_bins.get(release)
        if binary is None:
            binary = GoBinary(BUILD_NODE_SH, "NODEAGENT_NODE_BIN", RealNodeError, args=(release,))
            _node_bins[release] = binary
    return binary.path()


def build_runtime() -> pathlib.Path:
    """tests/harness/realnode/build-runtime.sh (a no-op when cached): the directory with containerd,
    containerd-shim-runc-v2, ctr, runc and busybox."""
    return _runtime.path()


def real_node_apiserver_kwargs(apiserver_dir: pathlib.Path, node: str = "node-a") -> dict[str, Any]:
    """Keyword arguments of ``start_apiserver(apiserver_dir, **...)`` for a real node: only
    ``node`` has credentials, and kube-apiserver reaches the kubelet (pod logs, exec) at its
    InternalIP with the harness's admin certificate (which the harness writes into
    ``apiserver_dir`` before kube-apiserver starts)."""
    d = pathlib.Path(apiserver_dir).resolve()
    return {
        "nodes": (node,),
        "extra_args": (
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={d / 'admin.crt'}",
            f"--kubelet-client-key={d / 'admin.key'}",
        ),
    }


def _foreign_addresses(own: Sequence[str]) -> list[str]:
    """The global addresses of this network namespace's links other than lo and ``own``: none in
    a namespace of the test's own, the VM's in the host's."""
    proc = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True)
    out = []
    for link in json.loads(proc.stdout):
        if link.get("ifname") in ("lo", *own):
            continue
        for addr in link.get("addr_info") or []:
            if addr.get("scope") not in ("host", "link"):
                out.append(f"{link.get('ifname')}: {addr.get('local')}")
    return out


def _links() -> set[str]:
    """The names of this network namespace's links."""
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(proc.stdout)}


def _cgroup_dirs() -> list[pathlib.Path]:
    """<controller>/k8s.io for every cgroup v1 hierarchy (and systemd, unified) that has one."""
    out = []
    for controller in sorted(CGROUP_ROOT.iterdir()):
        path = controller / CGROUP_PARENT
        if not controller.is_symlink() and path.is_dir():
            out.append(path)
    return out


class RealNode:
    """A running node: containerd, the kubelet and kube-scheduler. Use :func:`start_real_node`.

    Attributes:
        node_name: the Node's name (the kubelet's --hostname-override), e.g. ``node-a``
        workdir: everything the node writes, except cgroups and the CNI bridge link
        node_ip: the kubelet's address and the Node's InternalIP (on the veth link ``node_link``
            in the test's network namespace)
        kubelet_root: the kubelet's --root-dir
        registry_dir: kubelet_root/plugins_registry, where the kubelet's plugin watcher looks for
            registration sockets (a DRA driver's ``<driver>-reg.sock``)
        plugins_dir: kubelet_root/plugins (a DRA driver's endpoint: plugins/<driver>/dra.sock)
        device_plugins_dir: what the kubelet sees as /var/lib/kubelet/device-plugins
        cdi_dir: containerd's CDI spec directory (its only one)
        containerd_address: containerd's gRPC socket
        kubelet_port: the kubelet's HTTPS port on node_ip
        runtime_dir: containerd, ctr, runc, busybox (tests/harness/realnode/build-runtime.sh)
        node_binary: the kubelet + scheduler binary (tests/harness/apiserver/build-node.sh)
        containerd_log, kubelet_log, scheduler_log: the components' logs
        mount_ns_pid: a process in the node's mount namespace (for ``nsenter -t <pid> -m``)
    """

    def __init__(
        self,
        apiserver: ApiServer,
        workdir: pathlib.Path,
        node: str,
        node_binary: pathlib.Path,
        runtime_dir: pathlib.Path,
        node_ip: str = NODE_IP,
        node_link: str = NODE_LINK,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.apiserver = apiserver
        # Gates for the kubelet and the scheduler, as the apiserver got them (a DRA feature
        # beta-off in an older release must be on in all three to be used).
        self.feature_gates = dict(feature_gates or {})
        self.node_name = node
        self.workdir = pathlib.Path(workdir).resolve()
        self.node_ip = node_ip
        self.node_link = node_link
        self._added_link = False
        self.node_binary = node_binary
        self.runtime_dir = runtime_dir
        self.kubelet_root = self.workdir / "kubelet" / "root"
        self.registry_dir = self.kubelet_root / "plugins_registry"
        self.plugins_dir = self.kubelet_root / "plugins"
        self.hostpaths = self.workdir / "hostpaths"
        self.device_plugins_dir = self.hostpaths / "var/lib/kubelet/device-plugins"
        self.cdi_dir = self.workdir / "cdi"
        self.containerd_dir = self.workdir / "containerd"
        self.containerd_address = self.containerd_dir / "containerd.sock"
        self.containerd_log = self.workdir / "containerd.log"
        self.kubelet_log = self.workdir / "kubelet.log"
        self.scheduler_log = self.workdir / "scheduler.log"
        self.kubelet_port, self.kubelet_healthz_port = free_ports(2)
        self.bridge = f"{node_link}br"
        self._holder: subprocess.Popen[bytes] | None = None
        self._containerd: _Proc | None = None
        self._kubelet: _Proc | None = None
        self._scheduler: _Proc | None = None
        self._created_mountpoints: list[pathlib.Path] = []
        self._had_cgroups = {p for p in _cgroup_dirs()}
        self._closed = False

    # -- the mount namespace ------------------------------------------------

    @property
    def mount_ns_pid(self) -> int:
        if self._holder is None or self._holder.poll() is not None:
            raise RealNodeError("the node's mount namespace is gone")
        return self._holder.pid

    def _nsenter(self, argv: Sequence[str]) -> list[str]:
        env = f"PATH={self.runtime_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return ["nsenter", "-t", str(self.mount_ns_pid), "-m", "--", "env", env, *argv]

    def _start_namespace(self) -> None:
        """A process holding a private mount namespace with the hard-coded paths bind-mounted
        from the work dir; it prints "ready" once they are."""
        pairs: list[str] = []
        for path in HARDCODED_PATHS:
            target = pathlib.Path(path)
            source = self.hostpaths / path.lstrip("/")
            source.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                # An empty mount point on the host, removed at close; its content stays in the
                # work dir.
                missing = [p for p in (target, *target.parents) if not p.exists()]
                target.mkdir(parents=True)
                self._created_mountpoints.extend(missing)
            pairs += [str(source), str(target)]
        script = (
            'set -e; while [ $# -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done; '
            "echo ready; exec sleep infinity"
        )
        self._holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                *pairs,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # As _Proc does: PR_SET_PDEATHSIG follows the forking thread, so only the main one.
            preexec_fn=_pdeathsig
            if threading.current_thread() is threading.main_thread()
            else None,
        )
        assert self._holder.stdout is not None and self._holder.stderr is not None
        ready, _, _ = select.select([self._holder.stdout], [], [], START_TIMEOUT)
        line = self._holder.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self._holder.kill()
            err = self._holder.stderr.read().decode("utf-8", "replace")
            raise RealNodeError(f"cannot set up the node's mount namespace: {line!r} {err}")

    def run_on_node(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the node's mount namespace (seeing its bind mounts, e.g.
        /var/lib/kubelet/device-plugins, /run/containerd), with the runtime binaries on PATH.
        Plain host processes see kubelet_root, registry_dir, plugins_dir and cdi_dir too."""
        return subprocess.Popen(self._nsenter(argv), **popen)

    # -- containerd ------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 120.0) -> str:
        """``ctr --address <containerd> <args>`` (namespace flags are the caller's, e.g.
        ``ctr("-n", "k8s.io", "images", "ls")``); returns stdout, raises RealNodeError on
        failure."""
        argv = self._nsenter(["ctr", "--address", str(self.containerd_address), *args])
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def load_images(self) -> dict[str, pathlib.Path]:
        """Write the pause and busybox images (tests/realnode/images.py) and import them into
        containerd's k8s.io namespace; image name -> tar."""
        from tests.realnode.images import write_images

        tars = write_images(self.workdir / "images", self.runtime_dir / "busybox")
        for tar in tars.values():
            self.ctr("-n", "k8s.io", "images", "import", str(tar))
        return tars

    def _write_containerd_config(self) -> pathlib.Path:
        from tests.realnode.images import PAUSE_IMAGE

        d = self.containerd_dir
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        for sub in ("root", "state", "runc", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "realnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    # No gateway: the bridge gets no address (pods need none to reach); pods
                    # get theirs inside their own network namespaces.
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                        "ranges": [[{"subnet": POD_SUBNET}]],
                    },
                }
            ],
        }
        (cni_conf / "10-realnode.conflist").write_text(json.dumps(conflist, indent=1))

        def q(p: object) -> str:
            return json.dumps(str(p))  # a TOML basic string

        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        config = f"""version = 3
root = {q(d / "root")}
state = {q(d / "state")}

[grpc]
  address = {q(self.containerd_address)}
[ttrpc]
  address = {q(d / "containerd.sock.ttrpc")}
[debug]
  address = {q(d / "debug.sock")}

[plugins.'io.containerd.internal.v1.opt']
  path = {q(d / "opt")}
[plugins.'io.containerd.nri.v1.nri']
  socket_path = {q(d / "nri.sock")}

[{runtime}]
  restrict_oom_score_adj = true
  cdi_spec_dirs = [{q(self.cdi_dir)}]
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = {q(self.runtime_dir / "runc")}
        Root = {q(d / "runc")}
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = [{q(CNI_BIN_DIR)}]
    conf_dir = {q(cni_conf)}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(PAUSE_IMAGE)}
"""
        path = d / "config.toml"
        path.write_text(config)
        return path

    def _start_containerd(self) -> None:
        config = self._write_containerd_config()
        argv = self._nsenter([str(self.runtime_dir / "containerd"), "--config", str(config)])
        self._containerd = _Proc("containerd", argv, self.containerd_log)

        def up() -> tuple[bool | None, str]:
            if not self.containerd_address.exists():
                return None, f"no socket {self.containerd_address}"
            try:
                self.ctr("version", timeout=10)
            except (RealNodeError, subprocess.TimeoutExpired) as e:
                return None, str(e)
            return True, "ctr version answers"

        until(up, "containerd to serve", START_TIMEOUT, died=self._died)

    # -- kubelet and scheduler --------------------------------------------

    def _write_kubelet_config(self) -> pathlib.Path:
        d = self.workdir / "kubelet"
        for sub in ("root", "certs", "volume-plugins"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        config = {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            # cgroup v1 only, and no CAP_SYS_RESOURCE (docs/testing/real-node.md).
            "featureGates": self.feature_gates,
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.containerd_address}",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": self.node_ip,
            "healthzPort": self.kubelet_healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.apiserver.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "rotateCertificates": False,
            "localStorageCapacityIsolation": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "volumePluginDir": str(d / "volume-plugins"),
            # No host DNS servers in the pods (they talk to nothing).
            "resolvConf": "",
        }
        path = d / "config.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _start_kubelet(self) -> None:
        config = self._write_kubelet_config()
        argv = self._nsenter(
            [
                str(self.node_binary),
                "kubelet",
                f"--config={config}",
                f"--kubeconfig={self.apiserver.kubeconfig(self.node_name)}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_ip}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.workdir / 'kubelet' / 'certs'}",
                "--v=2",
            ]
        )
        self._kubelet = _Proc("kubelet", argv, self.kubelet_log)

    def _start_scheduler(self) -> None:
        argv = [
            str(self.node_binary),
            "scheduler",
            f"--kubeconfig={self.apiserver.kubeconfig('admin')}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=2",
            *_gate_flag(self.feature_gates),
        ]
        self._scheduler = _Proc("scheduler", argv, self.scheduler_log)

    def _died(self) -> str | None:
        for proc in (self._containerd, self._kubelet, self._scheduler):
            if proc is not None and not proc.alive():
                return (
                    f"{proc.name} exited with {proc.popen.returncode}; {proc.log} tail:\n"
                    f"{_tail(proc.log, 30)}"
                )
        return None

    # -- state ------------------------------------------------------------

    def node_object(self) -> dict[str, Any] | None:
        status, body = self.apiserver.request("GET", f"/api/v1/nodes/{self.node_name}")
        return body if status == 200 and isinstance(body, dict) else None

    def not_ready_reason(self) -> str | None:
        """Why the node is not Ready (None when it is): a component that exited, no Node object
        yet, or the Ready condition's status, reason and message."""
        dead = self._died()
        if dead is not None:
            return dead
        node = self.node_object()
        if node is None:
            return f"no Node {self.node_name} yet; kubelet log tail:\n{_tail(self.kubelet_log, 15)}"
        conditions = node.get("status", {}).get("conditions") or []
        ready = [c for c in conditions if c.get("type") == "Ready"]
        if not ready:
            return f"Node {self.node_name} has no Ready condition yet"
        c = ready[0]
        if c.get("status") == "True":
            return None
        return f"Ready={c.get('status')} ({c.get('reason')}: {c.get('message')})"

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the Node is Ready, then remove the taint the kubelet registers it with
        (``node.kubernetes.io/not-ready``), as the node lifecycle controller would: the harness
        runs no controller-manager, and the scheduler places no pod on a tainted node."""

        def ready() -> tuple[bool | None, str]:
            reason = self.not_ready_reason()
            return (True, "Ready") if reason is None else (None, reason)

        until(ready, f"node {self.node_name} to be Ready", timeout, died=self._died)

        def untainted() -> tuple[bool | None, str]:
            node = self.node_object()
            if node is None:
                return None, "no Node"
            taints = node.get("spec", {}).get("taints") or []
            keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
            if len(keep) == len(taints):
                return True, "untainted"
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": keep or None},
            }
            status, body = self.apiserver.request("PATCH", f"/api/v1/nodes/{self.node_name}", patch)
            return None, f"taints {taints}; PATCH -> {status}: {str(body)[:300]}"

        until(untainted, f"node {self.node_name}'s not-ready taint to go", timeout)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        status, body = self.apiserver.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return body if status == 200 and isinstance(body, dict) else None

    def wait_pod_phase(
        self, name: str, phases: Sequence[str], timeout: float = 120.0, namespace: str = "default"
    ) -> dict[str, Any]:
        """Wait until pod ``name`` is in one of ``phases``; return it. On timeout the message
        has its last phase, conditions and container states."""

        def check() -> tuple[dict[str, Any] | None, str]:
            pod = self.pod(name, namespace)
            if pod is None:
                return None, "no such pod"
            st = pod.get("status", {})
            if st.get("phase") in phases:
                return pod, st.get("phase", "")
            seen = {
                "nodeName": pod.get("spec", {}).get("nodeName"),
                "phase": st.get("phase"),
                "conditions": st.get("conditions"),
                "containerStatuses": st.get("containerStatuses"),
            }
            return None, json.dumps(seen)

        return until(
            check, f"pod {namespace}/{name} in {'/'.join(phases)}", timeout, died=self._died
        )

    def wait_pod_gone(self, name: str, timeout: float = 120.0, namespace: str = "default") -> None:
        def gone() -> tuple[bool | None, str]:
            pod = self.pod(name, namespace)
            if pod is None:
                return True, "gone"
            return None, json.dumps(pod.get("status", {}).get("containerStatuses"))

        until(gone, f"pod {namespace}/{name} to be deleted", timeout, died=self._died)

    def logs(self) -> Mapping[str, pathlib.Path]:
        return {
            "containerd": self.containerd_log,
            "kubelet": self.kubelet_log,
            "scheduler": self.scheduler_log,
        }

    # -- lifecycle ---------------------------------------------------------

    def _add_node_link(self) -> None:
        """The node IP on a link of the test's own network namespace."""
        peer = f"{self.node_link}p"
        foreign = _foreign_addresses([self.node_link, f"{self.node_link}p", self.bridge])
        if foreign:
            raise RealNodeError(
                "the real node runs only in a network namespace of the test's own (no address "
                "but loopback in the host's): run it with scripts/test-real-node, or under "
                f"`unshare --net` with lo up; this one has {', '.join(foreign)}"
            )
        cmds = [
            # A veth pair (these kernels have no dummy links), both ends up so it has carrier.
            ["ip", "link", "add", self.node_link, "type", "veth", "peer", "name", peer],
            ["ip", "addr", "add", f"{self.node_ip}/32", "dev", self.node_link],
            ["ip", "link", "set", peer, "up"],
            ["ip", "link", "set", self.node_link, "up"],
        ]
        for i, cmd in enumerate(cmds):
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RealNodeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
            if i == 0:
                self._added_link = True

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._add_node_link()
        self._start_namespace()
        self._start_containerd()
        self._start_kubelet()
        self._start_scheduler()

    def close(self) -> None:
        """Stop the kubelet, the scheduler, every container, containerd and its shims; remove
        what they left outside the work dir (cgroups, the bridge, mount points). Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for proc in (self._scheduler, self._kubelet):
            if proc is not None:
                proc.stop(timeout=20)
        # The containers: every process in containerd's cgroups (they are in their own mount
        # namespaces), then containerd, then whatever is left in the node's mount namespace
        # (the shims).
        try:
            self._kill_cgroup_processes()
        except wait.WaitTimeout as e:
            errors.append(str(e))
        if self._containerd is not None:
            self._containerd.stop(timeout=20)
        if self._holder is not None and self._holder.poll() is None:
            self._kill_namespace_processes()
            self._holder.kill()
        if self._holder is not None:
            self._holder.wait()
            for stream in (self._holder.stdout, self._holder.stderr):
                if stream is not None:
                    stream.close()
        errors += self._remove_cgroups()
        links = [self.bridge] + ([self.node_link] if self._added_link else [])
        # `ip`, not /sys/class/net: sysfs shows the links of the namespace that mounted it.
        present = _links()
        for name in links:
            if name in present:
                link = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True)
                if link.returncode != 0:
                    errors.append(f"ip link del {name}: {link.stderr.strip()}")
        for path in self._created_mountpoints:  # each one's children before its parents
            try:
                path.rmdir()
            except OSError as e:
                errors.append(f"rmdir {path}: {e}")
        if errors:
            raise RealNodeError("real node cleanup: " + "; ".join(errors))

    def _kill_cgroup_processes(self) -> None:
        """SIGKILL every process in containerd's cgroups until none is left."""

        def none_left() -> bool:
            pids: set[int] = set()
            for top in _cgroup_dirs():
                for procs in top.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in procs.read_text().split())
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            return not pids

        wait.until(none_left, "the containers' processes to be gone", timeout=20)

    def _kill_namespace_processes(self) -> None:
        assert self._holder is not None
        try:
            ns = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        except OSError:
            return
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self._holder.pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == ns:
                    os.kill(int(entry.name), 9)

    def _remove_cgroups(self) -> list[str]:
        errors = []
        for top in _cgroup_dirs():
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            if top not in self._had_cgroups:
                dirs.append(top)
            for d in dirs:
                try:
                    d.rmdir()
                except OSError as e:
                    errors.append(f"rmdir {d}: {e}")
        return errors

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def start_real_node(
    apiserver: ApiServer,
    workdir: pathlib.Path,
    node: str = "node-a",
    *,
    node_ip: str = NODE_IP,
    node_link: str = NODE_LINK,
    timeout: float = START_TIMEOUT,
    feature_gates: Mapping[str, bool] | None = None,
) -> Iterator[RealNode]:
    """Build what is missing (the node binary of ``apiserver.release``, the runtime), start
    containerd, the kubelet (``node``'s credentials) and kube-scheduler, and wait until the
    Node is Ready. The apiserver needs :func:`real_node_apiserver_kwargs`; the test process
    must be in a network namespace of its own (scripts/test-real-node runs pytest so), where the
    node adds the link ``node_link`` with ``node_ip``. Everything is stopped
    and removed on exit."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        raise RealNodeError("needs unshare and nsenter (util-linux)")
    node_binary = build_node_binary(apiserver.release)
    runtime_dir = build_runtime()
    rn = RealNode(
        apiserver, workdir, node, node_binary, runtime_dir, node_ip, node_link, feature_gates
    )
    try:
        rn.start()
        rn.wait_ready(timeout)
        yield rn
    finally:
        rn.close()
