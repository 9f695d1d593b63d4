"""Render an effective configuration (any msgspec struct of tables) as TOML or JSON, for
`check-config` and `/v1/config`."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec


def to_builtins(config: msgspec.Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(config)
    return out


def to_json(config: msgspec.Struct) -> str:
    return json.dumps(to_builtins(config), indent=2, sort_keys=False) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are a subset of TOML basic-string escapes.
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")


def _table(name: str, doc: dict[str, Any], lines: list[str]) -> None:
    lines.append(f"[{name}]")
    subtables: list[tuple[str, dict[str, Any]]] = []
    for key, value in doc.items():
        if value is None:
            # TOML has no null: show the key so the reader knows it exists and is unset.
            lines.append(f"# {key} is unset")
        elif isinstance(value, dict) and value:
            subtables.append((f"{name}.{key}", value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    lines.append("")
    for sub_name, sub in subtables:
        _table(sub_name, sub, lines)


def to_toml(config: msgspec.Struct) -> str:
    lines: list[str] = []
    for name, section in to_builtins(config).items():
        _table(name, section, lines)
    return "\n".join(lines)
