"""Every shipped manifest (deploy/crds, deploy/kubernetes) validated offline against the OpenAPI
schemas of the Kubernetes version the test harness runs, strictly (an unknown field is an error):
kubernetes-validate, installed by scripts/deploy-tools. The server-side dry-run on the real
apiserver (test_deploy_daemonset.py) is the check that counts; this one names the field and
needs no cluster."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs or py.typed
import pytest

import nodeagent
from tests.deploy.manifests import all_manifest_files, daemonset_container
from tests.support.apiserver import newest_release
from tests.support.crds import REPO_ROOT, load_manifest

GO_MOD = REPO_ROOT / "tests" / "apiserver" / "releases" / newest_release() / "go.mod"


def harness_version() -> str:
    """The harness's Kubernetes minor version (kubernetes-validate's schemas are per minor)."""
    match = re.search(r"^\s*k8s\.io/kubernetes v(\d+)\.(\d+)\.\d+", GO_MOD.read_text(), re.M)
    assert match, f"no k8s.io/kubernetes in {GO_MOD}"
    return f"{match[1]}.{match[2]}.0"


MANIFESTS = [(path, doc) for path in all_manifest_files() for doc in load_manifest(path)]
DOCS = [
    pytest.param(doc, id=f"{path.name}:{doc['kind']}/{doc['metadata']['name']}")
    for path, doc in MANIFESTS
]


def test_the_schemas_are_the_harness_version() -> None:
    assert harness_version() == "1.37.0"


@pytest.mark.parametrize("doc", DOCS)
def test_manifest_is_valid_for_the_harness_version(doc: dict[str, Any]) -> None:
    validated = kubernetes_validate.validate(doc, harness_version(), strict=True)
    assert validated == harness_version().rsplit(".", 1)[0]


def test_strict_validation_names_an_unknown_field() -> None:
    (daemonset,) = [doc for _, doc in MANIFESTS if doc["kind"] == "DaemonSet"]
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 3
    with pytest.raises(kubernetes_validate.ValidationError) as refused:
        kubernetes_validate.validate(broken, harness_version(), strict=True)
    assert "periodSecond" in refused.value.message


def test_the_daemonset_runs_the_image_of_this_version() -> None:
    # deploy/image/build.sh tags the image with the package version.
    assert daemonset_container()["image"] == f"nodeagent:{nodeagent.__version__}"
