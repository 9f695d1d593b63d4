"""The NodeAgentConfig CRD's spec.config schema and the agent's dynamic fields stay in sync: the
same fields, the OpenAPI type of each settings struct's field, the enum of a Literal, and bounds
that refuse exactly what the agent's own validation refuses."""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec
import msgspec.yaml
import pytest

from nodeagent.config.loader import Environment
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.overlay import DYNAMIC_FIELDS, STATIC_ONLY
from nodeagent.dynconfig.source import GROUP, KIND, PLURAL, VERSION
from nodeagent.service.config import Config, build_config
from tests.support.nodeagentconfig import NAC_CRD_FILE

ENV = Environment(uid=1000, env={}, hostname="node-a", home="/home/agent")
OPENAPI_TYPE = {float: "number", int: "integer", bool: "boolean", str: "string"}


def _crd() -> dict[str, Any]:
    docs = [
        msgspec.yaml.decode(part)
        for part in re.split(r"^---[ \t]*$", NAC_CRD_FILE.read_text(), flags=re.M)
    ]
    (crd,) = [d for d in docs if d is not None]
    assert isinstance(crd, dict)
    return crd


def _config_schema() -> dict[str, dict[str, Any]]:
    """``{"table.field": schema}`` of spec.config."""
    (version,) = _crd()["spec"]["versions"]
    config = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["config"]
    return {
        f"{table}.{name}": schema
        for table, table_schema in config["properties"].items()
        for name, schema in table_schema["properties"].items()
    }


def _field_type(path: str) -> Any:
    table, name = path.split(".")
    tables = {f.name: f.type for f in msgspec.structs.fields(Config)}
    fields = {f.name: f.type for f in msgspec.structs.fields(tables[table])}
    if typing.get_origin(fields[name]) is typing.Annotated:  # a typed constraint (core.rules)
        return typing.get_args(fields[name])[0]
    return fields[name]


def test_the_crd_names_the_agents_group_version_and_kind() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (GROUP, KIND)
    assert crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == VERSION and version["subresources"] == {"status": {}}


def test_spec_config_lists_exactly_the_dynamic_fields() -> None:
    assert set(_config_schema()) == DYNAMIC_FIELDS


@pytest.mark.parametrize("path", sorted(DYNAMIC_FIELDS))
def test_each_field_has_the_settings_structs_type(path: str) -> None:
    schema = _config_schema()[path]
    annotation = _field_type(path)
    if typing.get_origin(annotation) is typing.Literal:
        assert schema["type"] == "string"
        assert schema["enum"] == list(typing.get_args(annotation))
    else:
        assert schema["type"] == OPENAPI_TYPE[annotation]


def _agent_accepts(path: str, value: float) -> bool:
    table, name = path.split(".")
    try:
        build_config({table: {name: value}}, environment=ENV)
    except ConfigError as exc:
        assert exc.field == path
        return False
    return True


@pytest.mark.parametrize(
    "path", sorted(p for p in DYNAMIC_FIELDS if _config_schema()[p]["type"] == "number")
)
def test_each_numbers_minimum_is_the_agents(path: str) -> None:
    schema = _config_schema()[path]
    assert schema.get("minimum") == 0, "every dynamic number has a lower bound of 0"
    exclusive = schema.get("exclusiveMinimum", False)
    assert _agent_accepts(path, 0.0) is not exclusive
    assert not _agent_accepts(path, -1e-9)
    assert _agent_accepts(path, 1e-3)


def test_the_static_fields_the_issue_names_exist_and_are_static() -> None:
    named = {"agent.node_name", "agent.state_dir", "ops.address", "kube", "plugins.registry_dir"}
    assert named <= STATIC_ONLY
    tables = {f.name: f.type for f in msgspec.structs.fields(Config)}
    for path in named:
        table, _, name = path.partition(".")
        assert table in tables
        assert not name or name in {f.name for f in msgspec.structs.fields(tables[table])}
