"""Render an effective configuration (any msgspec struct of tables) as TOML or JSON, for
`check-config` and `/v1/config`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
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


# A default computed from other settings (or the machine): its value and how it is computed,
# by dotted key ("plugins.endpoint_dirs").
Computed = Mapping[str, tuple[Any, str]]


def _table(name: str, doc: dict[str, Any], lines: list[str], computed: Computed) -> None:
    lines.append(f"[{name}]")
    subtables: list[tuple[str, dict[str, Any]]] = []
    for key, value in doc.items():
        if value is None and f"{name}.{key}" in computed:
            # Commented out: the output read back keeps the setting unset, so the value still
            # follows what it is computed from.
            value, how = computed[f"{name}.{key}"]
            lines.append(f"# {key} = {_toml_value(value)}  # computed (unset): {how}")
        elif value is None:
            # TOML has no null: show the key so the reader knows it exists and is unset.
            lines.append(f"# {key} is unset")
        elif isinstance(value, dict) and value:
            subtables.append((f"{name}.{key}", value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    lines.append("")
    for sub_name, sub in subtables:
        _table(sub_name, sub, lines, computed)


def to_toml(config: msgspec.Struct, computed: Computed | None = None) -> str:
    """TOML of `config`; an unset setting with a `computed` default shows that value, marked
    computed."""
    lines: list[str] = []
    for name, section in to_builtins(config).items():
        _table(name, section, lines, computed or {})
    return "\n".join(lines)
