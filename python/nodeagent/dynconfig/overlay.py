"""The remote overlay: which fields a NodeAgentConfig may set, and laying them over the local
configuration document before the service validates it exactly as it validates the file.

The dynamic set is explicit and small on purpose (operators asked KEP-281 to restrict which
fields may change): a field is here only if a running agent takes it without a restart. Adding
one means making its component read it live (the service's ConfigHub; accumulator.max_interval
stays static: it paces the very watch that delivers remote configs) and adding it to
``deploy/crds/nodeagent.io_nodeagentconfigs.yaml`` (a unit test keeps the three in sync).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nodeagent.core.errors import ConfigError

__all__ = ["DYNAMIC_FIELDS", "STATIC_ONLY", "config_hash", "overlay_raw"]

DYNAMIC_FIELDS: frozenset[str] = frozenset(
    {
        "agent.log_level",
        "plugins.scan_interval",
        "plugins.probe_interval",
        "plugins.stream_min_interval",
        "resources.min_sync_interval",
        "resources.disconnect_grace",
        "reporter.cnr_min_write_interval",
        "reporter.grace",
    }
)

# Fields (or whole tables, written without a field) that name who and where the agent is, or
# guard the remote config itself: a remote object setting one is refused with its own rule, so
# the operator reads "static-only" rather than a generic "not dynamic".
STATIC_ONLY: frozenset[str] = frozenset(
    {
        "agent.node_name",
        "agent.state_dir",
        "ops.address",
        "kube",  # kubeconfig, context, in_cluster: the credentials the remote config came by
        "plugins.registry_dir",
        "plugins.endpoint_dirs",
        "plugins.allowed_uids",
        "dynconfig",  # trial and rollback must not be switched off by what they guard
    }
)

# sha256 hex digits kept: 64 bits, plenty to tell configs apart, short enough for a label.
HASH_CHARS = 16


def _static(path: str) -> bool:
    table = path.partition(".")[0]
    return path in STATIC_ONLY or table in STATIC_ONLY


def _reject(path: str, value: Any) -> ConfigError:
    if _static(path):
        return ConfigError(
            path, value, "static-only field: set it in the local file (takes a restart)"
        )
    allowed = ", ".join(sorted(DYNAMIC_FIELDS))
    return ConfigError(path, value, f"not a dynamic field (dynamic fields: {allowed})")


def _check(remote: Mapping[str, Any]) -> None:
    for table, fields in remote.items():
        if not isinstance(fields, Mapping):
            if _static(str(table)):
                raise _reject(str(table), fields)
            raise ConfigError(str(table), fields, "must be a table of fields")
        for name, value in fields.items():
            path = f"{table}.{name}"
            if path not in DYNAMIC_FIELDS:
                raise _reject(path, value)


def overlay_raw(raw: dict[str, Any], remote: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (the file's document, ``--set`` already applied) with ``remote``'s dynamic fields
    laid over it, as a new document (``raw`` is left untouched). Raises ConfigError naming the
    first static-only or non-dynamic field; values are not checked here but by the caller's
    ``build_config``, so a remote value is held to exactly the file's rules."""
    _check(remote)
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for table, fields in remote.items():
        current = out.get(table)
        merged = dict(current) if isinstance(current, dict) else {}
        merged.update(fields)
        out[table] = merged
    return out


def config_hash(remote: Mapping[str, Any]) -> str:
    """A stable name for a remote config: sha256 of its canonical JSON (sorted keys, no
    whitespace), so the same content under any key order or object name hashes the same."""
    text = json.dumps(remote, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]
