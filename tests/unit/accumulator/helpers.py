"""Builders of watch events and List pages as the apiserver writes them."""

from __future__ import annotations

import json
from typing import Any


def obj(
    name: str,
    rv: int | str,
    namespace: str | None = "default",
    *,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    data: dict[str, str] | None = None,
    kind: str | None = "ConfigMap",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["uid"] = uid or f"uid-{namespace}-{name}"
    meta["resourceVersion"] = str(rv)
    if labels:
        meta["labels"] = labels
    out: dict[str, Any] = {}
    if kind is not None:
        out["kind"] = kind
        out["apiVersion"] = "v1"
    out["metadata"] = meta
    if data is not None:
        out["data"] = data
    return out


def dump(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def event(ty: str, o: dict[str, Any]) -> bytes:
    return dump({"type": ty, "object": o}) + b"\n"


def bookmark(rv: int | str) -> bytes:
    return event("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": str(rv)}})


def error_event(code: int = 410, reason: str = "Expired", message: str = "too old") -> bytes:
    status = {"kind": "Status", "status": "Failure", "code": code, "reason": reason}
    status["message"] = message
    return event("ERROR", status)


def page(items: list[dict[str, Any]], rv: int | str = 1, kind: str = "ConfigMapList") -> bytes:
    stripped = []
    for it in items:
        it = dict(it)
        it.pop("kind", None)
        it.pop("apiVersion", None)
        stripped.append(it)
    body: dict[str, Any] = {
        "kind": kind,
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(rv)},
    }
    body["items"] = stripped
    return dump(body)
