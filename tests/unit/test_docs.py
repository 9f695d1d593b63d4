"""The documentation against the code: every configuration field, CLI command and flag, and
metric is in its reference page under docs/operating/ (and nothing stale is), every field of the
NodeAgentConfig's rollout (spec.rollout, status) in docs/architecture/rollout.md, the examples that
moved into docs/ run as written, and the README stays the short page a newcomer reads, with its
two commands and working links. (The site's own links and anchors: `mkdocs build --strict`.)"""

from __future__ import annotations

import argparse
import importlib
import re
from typing import Any, cast

import msgspec
import msgspec.yaml
import prometheus_client
import pytest

import nodeagent.sdk
from nodeagent import cli
from nodeagent.resources.convert import from_native
from nodeagent.resources.model import validate_inventory
from nodeagent.sdk import Pool, build_inventory
from nodeagent.service.config import Config
from nodeagent.service.ops import OpsServer
from nodeagent.service.settings import OpsSettings
from tests.support.docs import (
    CLI,
    README,
    REPO_ROOT,
    code_block,
    documented_config_fields,
    documented_metrics,
    documented_rollout_fields,
    page,
)
from tests.support.nodeagentconfig import NAC_CRD_FILE

PACKAGE = REPO_ROOT / "python" / "nodeagent"


def config_fields() -> set[str]:
    fields: set[str] = set()
    for section in msgspec.structs.fields(Config):
        assert isinstance(section.type, type)
        fields.update(f"{section.name}.{f.name}" for f in msgspec.structs.fields(section.type))
    return fields


def test_every_config_field_is_documented() -> None:
    fields, documented = config_fields(), documented_config_fields()
    assert sorted(fields - documented) == [], "not in docs/operating/configuration.md's table"
    assert sorted(documented - fields) == [], "in configuration.md's table but not a field"


def test_a_missing_config_field_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    text = page("docs/operating/configuration.md")
    row = next(line for line in text.splitlines() if line.startswith("| `kube.request_timeout`"))
    monkeypatch.setattr("tests.support.docs.page", lambda path: text.replace(row + "\n", ""))
    assert "kube.request_timeout" not in documented_config_fields()
    assert "kube.request_timeout" in config_fields()


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_cli_command_and_flag_is_documented() -> None:
    text = page(CLI)
    assert "`nodeagent --version`" in text
    for name, parser in subcommands().items():
        assert re.search(rf"`nodeagent {re.escape(name)}\b", text), f"nodeagent {name}"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                assert re.search(rf"{re.escape(flag)}(?![\w-])", text), f"{name} {flag}"


def test_every_config_flag_names_its_field() -> None:
    rows = [line for line in page(CLI).splitlines() if line.startswith("| `--")]
    for dest, (key, _) in cli._FLAG_KEYS.items():
        flag = "--" + dest.replace("_", "-")
        (row,) = (r for r in rows if r.startswith(f"| `{flag} "))
        assert f"`{key}`" in row, flag


def declared_metrics() -> set[str]:
    """Every metric family of the agent as /metrics names it (counters with `_total`, infos
    with `_info`): each module of the package that defines metrics imported."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "prometheus_client" in path.read_text(encoding="utf-8"):
            module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            importlib.import_module(module)
    suffix = {"counter": "_total", "info": "_info"}
    return {
        family.name + suffix.get(family.type, "")
        for family in prometheus_client.REGISTRY.collect()
        if family.name.startswith("nodeagent_")
    }


def test_every_metric_is_documented() -> None:
    declared, documented = declared_metrics(), documented_metrics()
    assert sorted(declared - documented) == [], "not in docs/operating/metrics.md's table"
    assert sorted(documented - declared) == [], "in metrics.md's table but not a metric"


def _schema_fields(schema: dict[str, Any], path: str) -> set[str]:
    """The dotted names of a CRD schema's fields: each leaf, each array and each atomic map
    (a label selector is one field)."""
    properties = schema.get("properties")
    if not properties or schema.get("x-kubernetes-map-type") == "atomic":
        return {path}
    return {
        name for key, sub in properties.items() for name in _schema_fields(sub, f"{path}.{key}")
    }


def crd_rollout_fields() -> set[str]:
    """The NodeAgentConfig CRD's `spec.rollout` and `status` fields."""
    text = NAC_CRD_FILE.read_text(encoding="utf-8")
    (crd,) = [
        doc
        for part in re.split(r"^---[ \t]*$", text, flags=re.M)
        if (doc := msgspec.yaml.decode(part)) is not None
    ]
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    rollout = schema["spec"]["properties"]["rollout"]
    return _schema_fields(rollout, "spec.rollout") | _schema_fields(schema["status"], "status")


def test_every_rollout_crd_field_is_documented() -> None:
    fields, documented = crd_rollout_fields(), documented_rollout_fields()
    assert sorted(fields - documented) == [], "not in docs/architecture/rollout.md's tables"
    assert sorted(documented - fields) == [], "in rollout.md's tables but not a CRD field"


def test_the_device_model_example_builds_a_valid_inventory() -> None:
    namespace: dict[str, Any] = {}
    exec(code_block("docs/plugins/python-sdk.md", "# Writing a plugin", "python"), namespace)
    pool = Pool("node-a", [namespace["nic"], namespace["cpu"]], skip_node_operations=["*"])
    inventory = from_native("example.com", build_inventory([pool]))
    validate_inventory(inventory)  # the agent's rules: raises on any broken one
    assert [d.name for d in inventory.pools[0].devices] == ["nic-0", "cpu-0"]


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for command in ("bash scripts/run", "bash scripts/test"):
        assert f"\n```sh\n{command}\n```\n" in text, command
    assert (REPO_ROOT / ".ci" / "run").read_text().rstrip().endswith("exec bash scripts/test")


def test_the_readme_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, _ = link.partition("#")
        assert not link.startswith("#"), f"{link}: the README's sections moved to docs/"
        assert (REPO_ROOT / target).exists(), link


def test_the_api_reference_lists_every_sdk_name() -> None:
    text = page("docs/plugins/api.md")
    for name in nodeagent.sdk.__all__:
        assert f"\n::: nodeagent.sdk.{name}\n" in text, name


def test_every_ops_path_is_documented() -> None:
    text = page("docs/operating/ops-endpoint.md")
    rows = set(re.findall(r"(?m)^\| `(/[^`]*)` \|", text))
    server = OpsServer(OpsSettings(public_address="127.0.0.1:0"), cast(Any, None))
    assert sorted(set(server._routes) - rows) == [], "not in ops-endpoint.md's table"
    assert sorted(rows - set(server._routes)) == [], "in ops-endpoint.md's table but not served"
    assert server.public is not None
    public = sorted(server.public.routes)
    assert public == ["/healthz", "/metrics", "/readyz"]
    assert "only `/healthz`,\n  `/readyz` and `/metrics`" in text
