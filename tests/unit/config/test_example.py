"""deploy/config.example.toml documents every field and is itself a valid configuration."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from nodeagent.config.loader import Environment
from nodeagent.service.config import Config, build_config

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "config.example.toml"
ENV = Environment(uid=0, env={}, hostname="worker-1", home="/root")


def test_example_parses_to_the_defaults() -> None:
    raw = msgspec.toml.decode(EXAMPLE.read_bytes())
    assert build_config(raw, environment=ENV) == build_config({}, environment=ENV)


def test_example_documents_every_field_with_a_valid_value() -> None:
    # Uncomment the "# key = value" lines: the result must still be valid and cover every field.
    text = re.sub(r"(?m)^# ([a-z_]+ = )", r"\1", EXAMPLE.read_text())
    raw = msgspec.toml.decode(text.encode())
    build_config(raw, environment=ENV)
    for section in msgspec.structs.fields(Config):
        assert isinstance(section.type, type)
        expected = {f.name for f in msgspec.structs.fields(section.type)}
        assert set(raw[section.name]) == expected, section.name
