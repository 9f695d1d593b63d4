"""The docs' "Install with Helm" commands (docs/operating/deploying.md), exactly as written, run
with the real `helm` against the real kube-apiserver (a kubeconfig of the harness's admin): `helm
install` creates the CRDs from the chart's crds/ and every object, `helm upgrade` with a values
file adds the config file, and the DaemonSet's pods follow the config (the checksum annotation)."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

import nodeagent
from nodeagent.kube import ClusterConfig, KubeClient
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.crds import REPO_ROOT
from tests.support.helm import helm_binary

# Its own apiserver: helm refuses to adopt objects another test applied.
apiserver = apiserver_fixture(scope="module", name="apiserver")

PAGE = REPO_ROOT / "docs" / "operating" / "deploying.md"
HEADING = "## Install with Helm"
MY_VALUES = """\
config:
  agent: {log_format: json}
  resources: {disconnect_grace: 45}
daemonset:
  nodeSelector: {kubernetes.io/os: linux}
"""


def documented_commands() -> list[list[str]]:
    """The first ```sh block after the heading on the page, one command a line."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADING)
    opening = lines.index("```sh", start)
    closing = lines.index("```", opening + 1)
    return [shlex.split(line) for line in lines[opening + 1 : closing] if line.strip()]


@pytest.fixture
async def admin(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    config = ClusterConfig(
        server=apiserver.url, ca_file=str(apiserver.ca_file), token=apiserver.token("admin")
    )
    async with KubeClient(config, qps=500.0, burst=1000) as client:
        yield client


def _run(command: list[str], cwd: pathlib.Path, apiserver: ApiServer) -> str:
    assert command[0] == "helm", command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env |= {
        "KUBECONFIG": str(apiserver.kubeconfig("admin")),
        # helm's own cache, configuration and data: in the test's directory, not the user's.
        "HELM_CACHE_HOME": str(cwd / ".helm-cache"),
        "HELM_CONFIG_HOME": str(cwd / ".helm-config"),
        "HELM_DATA_HOME": str(cwd / ".helm-data"),
    }
    answer = subprocess.run(
        [str(helm_binary()), *command[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert answer.returncode == 0, f"{shlex.join(command)}\n{answer.stdout}\n{answer.stderr}"
    return answer.stdout


async def _get(
    admin: KubeClient, api_version: str, kind: str, name: str, ns: str | None
) -> dict[str, Any]:
    resource = await admin.discover(api_version, kind)
    found: dict[str, Any] = msgspec.json.decode(await admin.get(resource, name, ns))
    return found


async def test_the_documented_commands_install_and_upgrade(
    apiserver: ApiServer, admin: KubeClient, tmp_path: pathlib.Path
) -> None:
    install, upgrade = documented_commands()
    assert install[:3] == ["helm", "install", "nodeagent"] and upgrade[:2] == ["helm", "upgrade"]
    # The commands name the chart by its path in the repository and my-values.yaml in the
    # working directory: both are there.
    (tmp_path / "deploy").symlink_to(REPO_ROOT / "deploy")
    (tmp_path / "my-values.yaml").write_text(MY_VALUES)

    out = _run(install, tmp_path, apiserver)
    assert "STATUS: deployed" in out and "nodeagent status" in out  # NOTES.txt
    for crd in ("nodeagentconfigs.nodeagent.io", "customnoderesources.node.katalyst.kubewharf.io"):
        await _get(admin, "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd, None)
    daemonset = await _get(admin, "apps/v1", "DaemonSet", "nodeagent", "nodeagent")
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # The image the page says to build and load on the nodes, by the name it carries.
    assert _image(daemonset) == f"docker.io/library/nodeagent:{nodeagent.__version__}"
    before = daemonset["spec"]["template"]["metadata"].get("annotations", {})
    assert "checksum/config" not in before
    for name in ("resourceslices-own-node-sa", "cnr-own-node-sa", "node-status-own-condition-sa"):
        policy = await _get(
            admin,
            "admissionregistration.k8s.io/v1",
            "ValidatingAdmissionPolicy",
            f"nodeagent-{name}",
            None,
        )
        (condition,) = policy["spec"]["matchConditions"]
        assert "'system:serviceaccount:nodeagent:nodeagent'" in condition["expression"]

    out = _run(upgrade, tmp_path, apiserver)
    assert "STATUS: deployed" in out and "REVISION: 2" in out
    configmap = await _get(admin, "v1", "ConfigMap", "nodeagent-config", "nodeagent")
    assert 'log_format = "json"' in configmap["data"]["config.toml"]
    daemonset = await _get(admin, "apps/v1", "DaemonSet", "nodeagent", "nodeagent")
    spec = daemonset["spec"]["template"]
    assert "checksum/config" in spec["metadata"]["annotations"]
    assert spec["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "--config=/etc/nodeagent/config.toml" in spec["spec"]["containers"][0]["args"]
    assert _image(daemonset) == f"docker.io/library/nodeagent:{nodeagent.__version__}"


def _image(daemonset: dict[str, Any]) -> str:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    image: str = container["image"]
    return image
