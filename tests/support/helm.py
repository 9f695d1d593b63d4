"""The `helm` CLI built from the Go module proxy (tests/harness/helm/build.sh, cached by the hash of
its sources), and the chart deploy/helm/nodeagent rendered with it; the Prometheus Operator's CRDs
(for the chart's PodMonitor, ServiceMonitor and PrometheusRule) from its Go module, checked against
the Go checksum database by `go mod download`."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

import msgspec

from tests.support.crds import REPO_ROOT
from tests.support.gobuild import GoBinary

__all__ = [
    "CHART",
    "IMAGE_VALUES",
    "PROMETHEUS_OPERATOR",
    "HelmError",
    "helm",
    "helm_binary",
    "parse_manifest",
    "prometheus_operator_crds",
    "template",
]

CHART = REPO_ROOT / "deploy" / "helm" / "nodeagent"
BUILD_SH = REPO_ROOT / "tests" / "harness" / "helm" / "build.sh"
# The Prometheus Operator release whose CRDs (example/prometheus-operator-crd/ of its module)
# the chart's monitoring objects are applied against.
PROMETHEUS_OPERATOR = "v0.85.0"
_MODULE = "github.com/prometheus-operator/prometheus-operator"


# The chart requires image.repository: the tests render it with the plain manifests' image
# (scripts/render-manifests), a values file before theirs so that theirs win.
IMAGE_VALUES = pathlib.Path(__file__).with_name("helm-image-values.yaml")


class HelmError(RuntimeError):
    pass


_HELM = GoBinary(BUILD_SH, "NODEAGENT_HELM", HelmError)


def helm_binary() -> pathlib.Path:
    return _HELM.path()


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with a private HOME-less configuration (no repositories, no plugins, no cache of
    the developer's), from the repository root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    proc = subprocess.run(
        [str(helm_binary()), *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc


def parse_manifest(text: str, source: str = "<helm template>") -> list[dict[str, Any]]:
    """The objects of a multi-document YAML stream (split at `---` lines, as tests.support.crds'
    load_manifest does; the chart's output has no such line inside a block scalar)."""
    parts = (msgspec.yaml.decode(part) for part in re.split(r"^---[ \t]*$", text, flags=re.M))
    docs = [d for d in parts if d is not None]
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            raise ValueError(f"{source}: document {i} is not a Kubernetes object")
    return docs


def template(
    release: str = "nodeagent",
    namespace: str = "nodeagent",
    values: Sequence[pathlib.Path] = (),
    sets: Sequence[str] = (),
    *,
    include_crds: bool = False,
    skip_schema: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its objects, in helm's install order. ``skip_schema``: without
    values.schema.json's checks (to render values the agent's schema refuses)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for path in [IMAGE_VALUES, *values]:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    if include_crds:
        args.append("--include-crds")
    if skip_schema:
        args.append("--skip-schema-validation")
    return parse_manifest(helm(*args).stdout)


def prometheus_operator_crds() -> list[pathlib.Path]:
    """The Prometheus Operator's CRDs of PROMETHEUS_OPERATOR (its Go module, from the module
    cache or the proxy; `go mod download` verifies it against sum.golang.org)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{_MODULE}@{PROMETHEUS_OPERATOR}"],
        cwd="/",  # outside any module
        env=os.environ | {"GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise HelmError(f"go mod download {_MODULE}@{PROMETHEUS_OPERATOR}: {proc.stderr}")
    directory = pathlib.Path(json.loads(proc.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return sorted(directory.glob("monitoring.coreos.com_*.yaml"))
