"""The JSON the ops views promise, where the data underneath holds bytes.

protobuf's JSON mapping (and msgspec's) renders a `bytes` field as base64, which hides what a
plugin sent. The one bytes field plugins send is a reporter's `ReportField.value`, documented as
the JSON of the field's Go type: it is shown as that JSON, or, when it is not JSON, as base64
with a note saying so. `json_default` is the last resort for any other bytes in a view.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from typing import Any

REPORTER_TYPE = "ReporterPlugin"


def decode_value(encoded: str) -> dict[str, Any]:
    """A reporter field's `value` (base64 from protobuf's JSON mapping) as the view shows it."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return {"value_base64": encoded, "value_note": "not base64"}
    try:
        return {"value": json.loads(raw.decode("utf-8"))}
    except (UnicodeDecodeError, ValueError) as exc:
        return {
            "value_base64": encoded,
            "value_note": f"not JSON ({len(raw)} bytes): {exc}",
        }


def _report_fields(message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        return []
    out: list[dict[str, Any]] = []
    for content in message.get("content") or []:
        if isinstance(content, dict):
            out += [f for f in content.get("field") or [] if isinstance(f, dict)]
    return out


def plugins_view(plugins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`/v1/plugins`: reporter values as JSON instead of base64 (the input is not changed)."""
    out: list[dict[str, Any]] = []
    for plugin in plugins:
        message = plugin.get("last_message")
        if plugin.get("type") != REPORTER_TYPE or not message:
            out.append(plugin)
            continue
        plugin = {**plugin, "last_message": copy.deepcopy(message)}
        for item in _report_fields(plugin["last_message"]):
            encoded = item.pop("value", "")
            # protobuf's JSON mapping leaves an empty value out; so does the view.
            if isinstance(encoded, str) and encoded:
                item.update(decode_value(encoded))
        out.append(plugin)
    return out


def json_default(value: object) -> object:
    """For `json.dumps`: bytes as the JSON they hold, else base64 with a note; others as str."""
    if isinstance(value, bytes | bytearray):
        shown = decode_value(base64.b64encode(bytes(value)).decode("ascii"))
        if "value" in shown:
            return shown["value"]
        return {"base64": shown["value_base64"], "note": shown["value_note"]}
    return str(value)


def config_document(effective: dict[str, Any], dynamic: dict[str, Any] | None) -> dict[str, Any]:
    """The /v1/config document: the effective configuration (what `check-config` prints) and,
    with dynamic configuration on, where it came from: assigned / active / last-known-good
    (hash, name, since), the reloaded file, the trial, and why they differ (`reason` and
    `message` of the NodeAgentConfigOK condition, `differ` one line per difference)."""
    if dynamic is None:
        return {"effective": effective, "dynamic": None}
    condition = dynamic.get("condition") or {}
    return {
        "effective": effective,
        "dynamic": {
            "assigned": dynamic.get("assigned"),
            "active": dynamic.get("active"),
            "last_known_good": dynamic.get("last_known_good"),
            "file": dynamic.get("file"),
            "trial": dynamic.get("trial"),
            "boot": dynamic.get("boot"),
            "reason": condition.get("reason"),
            "message": condition.get("message"),
            "differ": dynamic.get("differ") or [],
        },
    }
