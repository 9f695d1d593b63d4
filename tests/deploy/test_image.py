"""The container image of deploy/image/build.sh, built offline from Debian packages and PyPI
wheels, loaded into podman from its OCI archive and run against the real kube-apiserver:

- as its default (non-root) user with node-a's kubeconfig mounted: READY over $NOTIFY_SOCKET,
  connected, and a clean stop (SIGTERM, exit 0);
- as the shipped DaemonSet's pod: the container's args, env, securityContext and volumes turned
  into podman flags, the service-account token of a Pod on the node mounted where the kubelet
  mounts it, the in-cluster environment: it publishes a real plugin's (the upstream Go DRA
  helper's) slices, as UID 0 with no capability;
- built twice from the same wheel it is the same image, byte for byte; it has no shell.

podman runs with runc (crun refuses this machine's hybrid cgroup v1/v2 hierarchy) and with
ulimits no higher than the current ones (the sandbox has no CAP_SYS_RESOURCE, so podman's
default of 1048576 open files cannot be set): see docs/operating/container-image.md."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import resource
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import NODES, RESOURCESLICES, errors
from tests.deploy.manifests import (
    NAMESPACE,
    apply_all,
    create_pod,
    daemonset_args,
    daemonset_container,
    daemonset_pod_spec,
    delete_pod,
    pod_token,
)
from tests.integration.conftest import client_for
from tests.process.conftest import NotifyListener
from tests.support.apiserver import ApiServer, apiserver_fixture, free_ports
from tests.support.crds import REPO_ROOT
from tests.support.draplugin import DraPlugin, KubeletDirs, instance, kubelet_dirs, named_resources
from tests.support.http import http_get
from tests.support.wait import until

# Its own apiserver: the DaemonSet test applies cluster-wide admission policies.
apiserver = apiserver_fixture(scope="module")

IMAGE_DIR = REPO_ROOT / "deploy" / "image"
BUILD_TIMEOUT = 900.0  # a cold build compiles the wheel (scripts/build-wheels)
WAIT = 60.0
NODE = "node-a"
POD = "nodeagent-image"
DRIVER = "gpu.image.example.com"
HOST_STATE = "/var/lib/nodeagent"  # the DaemonSet's hostPath, mounted at the same path
HOST_RUNTIME = "/run/nodeagent"  # the runtime directory's hostPath (RUNTIME_DIRECTORY)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts the token
NONROOT = 65532

# This machine's limits: podman sets rlimits in the container, and raising one needs
# CAP_SYS_RESOURCE. NPROC above a few thousand is refused here even below the hard limit.
_NOFILE = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536)
PODMAN = ["podman", "--runtime", "runc"]
ULIMITS = [f"--ulimit=nofile={_NOFILE}:{_NOFILE}", "--ulimit=nproc=4096:4096"]
RUN = ["run", "--detach", "--network=host", *ULIMITS]


def build(out: pathlib.Path, *args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """deploy/image/build.sh into `out`; its image.env as a dict."""
    done = subprocess.run(
        ["bash", str(IMAGE_DIR / "build.sh"), "--out", str(out), *args],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (out / "image.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def podman(*args: str, check: bool = True, stderr: bool = False) -> str:
    """podman's stdout (and stderr, where podman warns about this machine's cgroups, if asked)."""
    done = subprocess.run(
        [*PODMAN, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout + (done.stderr if stderr else "")


@contextlib.contextmanager
def shown_with(logs: Callable[[], str]) -> Iterator[None]:
    """A wait that gives up says what the container printed (its own account of why)."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None


def proc_status(container: str) -> dict[str, str]:
    """/proc/<pid>/status of the container's main process, seen from the host."""
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).strip()
    lines = pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict((k, v.strip()) for k, _, v in (line.partition(":") for line in lines))


def stop(container: str) -> int:
    """SIGTERM (podman stop) and the exit code; the container stays for its logs."""
    podman("stop", "--time", "30", container)
    return int(podman("inspect", "--format", "{{.State.ExitCode}}", container).strip())


def oci_blob(built: dict[str, str], digest: str) -> Any:
    path = pathlib.Path(built["ARCHIVE"]).parent / "oci" / "blobs" / "sha256"
    return json.loads((path / digest.removeprefix("sha256:")).read_text())


def oci_config_digest(built: dict[str, str]) -> str:
    digest: str = oci_blob(built, built["DIGEST"])["config"]["digest"]
    return digest


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The image built from this tree and loaded into podman (runc, podman from Debian)."""
    built = build(tmp_path_factory.mktemp("image"))
    subprocess.run(["bash", str(IMAGE_DIR / "tools.sh"), "podman", "runc"], check=True)
    loaded = podman("load", "--input", built["ARCHIVE"], stderr=True)
    assert f"Loaded image: {built['IMAGE']}" in loaded, loaded
    # Run and remove it by its ID (podman's ID is the config's digest): another test run may load
    # another build under the same name meanwhile, and must keep its containers (so no --force).
    built["ID"] = oci_config_digest(built).removeprefix("sha256:")
    podman("image", "exists", built["ID"])
    yield built
    podman("rmi", built["ID"], check=False)


@pytest.fixture
def container_name(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"nodeagent-test-{os.getpid()}-{request.node.name[:40]}"
    yield name
    podman("rm", "--force", name, check=False)


@pytest.fixture
def notify(tmp_path: pathlib.Path) -> Iterator[NotifyListener]:
    """A notify socket in its own directory (mounted into the container), writable by any UID."""
    directory = tmp_path / "notify"
    directory.mkdir()
    listener = NotifyListener(directory / "sock")
    os.chmod(directory, 0o755)
    os.chmod(listener.path, 0o777)
    yield listener
    listener.close()


def node_exists(apiserver: ApiServer, name: str) -> None:
    async def create() -> None:
        async with client_for(apiserver, "admin") as admin:
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            await admin.apply(NODES, node, field_manager="test")

    trio.run(create)


def test_the_daemonset_runs_the_image_this_builds(image: dict[str, str]) -> None:
    # A pod's `image: nodeagent:X` is docker.io/library/nodeagent:X to every runtime.
    assert f"docker.io/library/{daemonset_container()['image']}" == image["IMAGE"]


def test_the_image_has_no_shell_and_a_non_root_default_user(image: dict[str, str]) -> None:
    rootfs = pathlib.Path(image["ARCHIVE"]).parent / "rootfs"
    for shell in ("sh", "bash", "dash", "busybox"):
        for where in ("bin", "usr/bin", "sbin", "usr/sbin"):
            assert not (rootfs / where / shell).exists(), f"/{where}/{shell} in the image"
    manifest = oci_blob(image, image["DIGEST"])
    config = oci_blob(image, oci_config_digest(image))
    assert len(manifest["layers"]) == 1
    assert config["config"]["User"] == f"{NONROOT}:{NONROOT}"
    # No shell in between: the kernel runs the console script's shebang (the venv's python).
    assert config["config"]["Entrypoint"] == ["/opt/nodeagent/bin/nodeagent"]
    shebang = (rootfs / "opt/nodeagent/bin/nodeagent").read_text().splitlines()[0]
    assert shebang == "#!/opt/nodeagent/bin/python"
    version = podman("run", "--rm", "--network=none", *ULIMITS, image["ID"], "--version")
    assert version.strip() == f"nodeagent {image['IMAGE'].rpartition(':')[2]}", version


def test_the_image_as_its_default_user_connects_with_node_credentials(
    apiserver: ApiServer,
    image: dict[str, str],
    container_name: str,
    notify: NotifyListener,
    tmp_path: pathlib.Path,
) -> None:
    node_exists(apiserver, NODE)
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(apiserver.kubeconfig(NODE), kubeconfig)
    kubeconfig.chmod(0o644)  # the container's user is not the file's owner
    notify_dir = pathlib.Path(notify.path).parent
    podman(
        *RUN,
        f"--name={container_name}",
        f"--volume={kubeconfig}:/etc/nodeagent/kubeconfig:ro",
        f"--volume={notify_dir}:/run/notify",
        "--env=NOTIFY_SOCKET=/run/notify/sock",
        image["ID"],
        "run",
        "--kubeconfig=/etc/nodeagent/kubeconfig",
        f"--node-name={NODE}",
        "--ops-address=127.0.0.1:0",
    )

    def logs() -> str:
        return podman("logs", container_name, check=False, stderr=True)

    with shown_with(logs):
        fields = notify.wait_for("READY", timeout=WAIT)
    address = fields["STATUS"].split("ops on ", 1)[1].split()[0]

    def ready() -> str | None:
        code, text = http_get(address, "/readyz?verbose")
        return text if code == 200 else None

    with shown_with(logs):
        body = until(ready, "/readyz 200", timeout=WAIT)
    assert "[+]kube ok: connected" in body, body
    status = proc_status(container_name)
    assert status["Uid"].split()[0] == str(NONROOT), status["Uid"]
    assert stop(container_name) == 0, logs()
    assert notify.wait_for("STOPPING", timeout=5)


def daemonset_flags(
    dirs: KubeletDirs, ops_port: int, public_port: int
) -> tuple[list[str], list[str]]:
    """The shipped DaemonSet's container as podman flags and args: securityContext, volumes,
    env (NODE_NAME from spec.nodeName) and args, with the hostPath at the same path on the host
    and in the container (dirs.root) and the two ports free ones (the host's network)."""
    container = daemonset_container()
    pod = daemonset_pod_spec()
    security = dict(container["securityContext"])
    flags = [f"--user={security.pop('runAsUser')}:{security.pop('runAsGroup')}"]
    assert security.pop("allowPrivilegeEscalation") is False
    flags.append("--security-opt=no-new-privileges")
    if security.pop("readOnlyRootFilesystem"):
        flags.append("--read-only")
    assert security.pop("capabilities") == {"drop": ["ALL"]}
    flags.append("--cap-drop=all")
    assert security.pop("seccompProfile") == {"type": "RuntimeDefault"}  # podman's default
    assert not security, f"securityContext fields this test does not map: {security}"
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume and mount["mountPath"] == HOST_STATE:
            assert volume["hostPath"]["path"] == HOST_STATE
            flags.append(f"--volume={dirs.root}:{dirs.root}")
        elif "hostPath" in volume:
            # The runtime directory (RUNTIME_DIRECTORY): one of the test's at the pod's path,
            # writable by the image's default user as the kubelet's DirectoryOrCreate makes it
            # for a pod that runs as that user.
            assert volume["hostPath"]["path"] == mount["mountPath"] == HOST_RUNTIME
            runtime = dirs.root / "runtime"
            runtime.mkdir(exist_ok=True)
            os.chown(runtime, NONROOT, NONROOT)
            flags.append(f"--volume={runtime}:{HOST_RUNTIME}")
        else:
            assert volume["emptyDir"]["medium"] == "Memory", volume
            size = volume["emptyDir"]["sizeLimit"].removesuffix("Mi")
            flags.append(f"--tmpfs={mount['mountPath']}:size={size}m")
    for item in container["env"]:
        if "value" in item:
            flags.append(f"--env={item['name']}={item['value']}")
            continue
        assert item["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", item
        flags.append(f"--env={item['name']}={NODE}")
    return flags, daemonset_args(str(dirs.root), ops_port, public_port)


@pytest.fixture
def dirs() -> Iterator[KubeletDirs]:
    made = kubelet_dirs("na-img-")
    yield made
    made.remove()


@pytest.fixture
def sa_dir(apiserver: ApiServer, tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """Every shipped manifest applied, Node NODE, a Pod of the DaemonSet's service account on it,
    and the projected volume the kubelet would mount: a token bound to that Pod, ca.crt,
    namespace."""

    async def install() -> str:
        async with client_for(apiserver, "admin") as admin:
            await apply_all(admin)
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            await admin.apply(NODES, node, field_manager="test")
            return await pod_token(admin, await create_pod(admin, POD, NODE))

    token = trio.run(install)
    path = tmp_path / "serviceaccount"
    path.mkdir()
    (path / "token").write_text(token)
    shutil.copy(apiserver.ca_file, path / "ca.crt")
    (path / "namespace").write_text(NAMESPACE)
    yield path

    async def uninstall() -> None:
        async with client_for(apiserver, "admin") as admin:
            await delete_pod(admin, POD)

    trio.run(uninstall)


def node_slices(apiserver: ApiServer) -> list[dict[str, Any]]:
    async def get() -> list[dict[str, Any]]:
        async with client_for(apiserver, "admin") as admin:
            body = await admin.request(
                "GET", RESOURCESLICES.path(None), params={"fieldSelector": f"spec.nodeName={NODE}"}
            )
        items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
        return items

    try:
        return trio.run(get)
    except errors.KubeError:
        return []


def test_the_image_as_the_daemonset_pod_publishes_a_plugins_slices(
    apiserver: ApiServer,
    image: dict[str, str],
    container_name: str,
    notify: NotifyListener,
    dirs: KubeletDirs,
    sa_dir: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    plugin = DraPlugin.start(
        DRIVER, dirs, [named_resources(instance("gpu-0"), instance("gpu-1"))], workdir=tmp_path
    )
    try:
        ops_port, public_port = free_ports(2)
        flags, args = daemonset_flags(dirs, ops_port, public_port)
        host, _, port = apiserver.url.removeprefix("https://").rpartition(":")
        podman(
            *RUN,
            f"--name={container_name}",
            *flags,
            f"--volume={sa_dir}:{SA_DIR}:ro",
            f"--volume={pathlib.Path(notify.path).parent}:/run/notify",
            "--env=NOTIFY_SOCKET=/run/notify/sock",
            f"--env=KUBERNETES_SERVICE_HOST={host}",
            f"--env=KUBERNETES_SERVICE_PORT={port}",
            image["ID"],
            *args,
        )

        def logs() -> str:
            return podman("logs", container_name, check=False, stderr=True) + plugin.log()

        with shown_with(logs):
            notify.wait_for("READY", timeout=WAIT)
        with shown_with(logs):
            slices = until(
                lambda: (
                    [s for s in node_slices(apiserver) if s["spec"]["driver"] == DRIVER] or None
                ),
                f"{DRIVER}'s slices on {NODE}",
                timeout=WAIT,
            )
        devices = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
        assert devices == {"gpu-0", "gpu-1"}, slices
        # The probes' listener answers (what the kubelet asks).
        with shown_with(logs):
            until(
                lambda: http_get(f"127.0.0.1:{public_port}", "/readyz")[0] == 200,
                "/readyz",
                timeout=WAIT,
            )
        # `kubectl exec <pod> -- nodeagent status`: on PATH in the image, no shell needed.
        shown = podman(
            "exec", container_name, "nodeagent", "status", f"--ops-address=127.0.0.1:{ops_port}"
        )
        assert DRIVER in shown, shown
        status = proc_status(container_name)
        assert status["Uid"].split()[0] == "0"
        assert int(status["CapEff"], 16) == 0, status["CapEff"]
        assert status["NoNewPrivs"] == "1"
        assert stop(container_name) == 0, logs()
    finally:
        plugin.close()


def test_the_default_user_cannot_open_a_root_plugins_socket(
    image: dict[str, str],
    container_name: str,
    notify: NotifyListener,
    dirs: KubeletDirs,
    tmp_path: pathlib.Path,
) -> None:
    """Why the DaemonSet runs as UID 0: a plugin running as root (the kubelet convention) makes
    its socket 0755, and connecting needs write permission on it."""
    plugin = DraPlugin.start(DRIVER, dirs, [named_resources(instance("gpu-0"))], workdir=tmp_path)
    try:
        assert plugin.registration_socket.stat().st_mode & 0o022 == 0  # not group/other-writable
        dirs.root.chmod(0o755)  # as a hostPath the kubelet creates (DirectoryOrCreate)
        podman(
            *RUN,
            f"--name={container_name}",
            f"--volume={dirs.root}:{dirs.root}",
            f"--volume={pathlib.Path(notify.path).parent}:/run/notify",
            "--env=NOTIFY_SOCKET=/run/notify/sock",
            image["ID"],
            "run",
            f"--registry-dir={dirs.registry}",
            f"--state-dir={HOST_STATE}",
            f"--node-name={NODE}",
            "--ops-address=127.0.0.1:0",
        )

        def logs() -> str:
            return podman("logs", container_name, check=False, stderr=True) + plugin.log()

        fields = notify.wait_for("READY", timeout=WAIT)
        address = fields["STATUS"].split("ops on ", 1)[1].split()[0]

        def refused() -> str | None:
            code, text = http_get(address, "/v1/plugins")
            failed = [p for p in json.loads(text) if p["state"] == "failed"] if code == 200 else []
            return failed[0]["last_error"] if failed else None

        with shown_with(logs):
            error = until(refused, "the registration to fail", timeout=WAIT)
        assert "Permission denied" in error, error
        assert stop(container_name) == 0, logs()
    finally:
        plugin.close()


def test_two_builds_from_the_same_wheel_are_the_same_image(
    image: dict[str, str], tmp_path: pathlib.Path
) -> None:
    again = build(
        tmp_path / "again",
        "--wheel",
        image["WHEEL"],
        env={"SOURCE_DATE_EPOCH": image["SOURCE_DATE_EPOCH"]},
    )
    assert again["DIGEST"] == image["DIGEST"]

    def sha256(path: str) -> str:
        return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()

    assert sha256(again["ARCHIVE"]) == sha256(image["ARCHIVE"])
