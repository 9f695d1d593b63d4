"""The CLI's view: `nodeagent status` shows the ops endpoint's /v1 views as a readable table."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from nodeagent.log import escape_control

EXIT_READY = 0
EXIT_NOT_READY = 1
EXIT_UNREACHABLE = 3


class Unreachable(Exception):
    pass


def fetch(address: str, path: str, timeout: float = 5.0) -> Any:
    url = f"http://{address}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise Unreachable(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{url}: {reason}") from None


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    # Escaped here (not only on output) so an escaped cell's width is what the table pads to.
    return escape_control(" ".join(str(value).split()))


def _fit(text: str, width: int) -> str:
    # A cut cell ends in "…", so a shortened reason is never read as the whole one.
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 60) -> str:
    cells = [[_fit(_cell(v), max_width) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    if hours or days:
        parts.append(f"{hours}h")
    if minutes or hours or days:
        parts.append(f"{minutes}m")
    parts.append(f"{s}s")
    return "".join(parts)


def _first(doc: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if doc.get(key) not in (None, ""):
            return doc[key]
    return None


def _when(value: Any) -> Any:
    # Plugins report times as epoch seconds or as ISO strings; show both the same way.
    if isinstance(value, int | float) and value > 0:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
    return value


def render(status: dict[str, Any], plugins: list[dict[str, Any]]) -> str:
    ready = "READY" if status.get("ready") else "NOT READY"
    out = [
        f"nodeagent {status.get('version')} on node {status.get('node')} "
        f"({status.get('mode')}), pid {status.get('pid')}, "
        f"up {_duration(float(status.get('uptime_seconds') or 0))}: {ready}",
        "",
        table(
            ["COMPONENT", "READY", "PHASE", "RESTARTS", "REASON"],
            [
                [c.get("name"), c.get("ready"), c.get("phase"), c.get("restarts"), c.get("reason")]
                for c in status.get("components", [])
            ],
            max_width=100,
        ),
        "",
    ]
    # The state directory's trouble (read-only): the agent runs, its checkpoints do not keep.
    problems = status.get("checkpoint_problems") or []
    if problems:
        out += [f"checkpoints: {problem}" for problem in problems] + [""]
    if not plugins:
        out.append(f"no plugins (registry: {status.get('registry_dir')})")
    else:
        out.append(
            table(
                ["PLUGIN", "TYPE", "STATE", "STREAM", "MESSAGES", "LAST UPDATE", "LAST ERROR"],
                [
                    [
                        p.get("name"),
                        p.get("type"),
                        p.get("state"),
                        _first(p, "stream_state", "stream"),
                        _first(p, "messages_received", "messages"),
                        _when(_first(p, "last_message_time", "last_message_at", "last_update")),
                        # The stream's own error while it fails, else the registration's.
                        _first(p, "stream_error", "last_error"),
                    ]
                    for p in plugins
                ],
            )
        )
    pools = status.get("resourceslices") or []
    if pools:
        out += [
            "",
            table(
                ["DRIVER", "POOL", "SLICES", "DEVICES", "REGISTERED", "LAST ERROR"],
                [
                    [
                        p.get("driver"),
                        p.get("pool"),
                        p.get("slices"),
                        p.get("devices"),
                        p.get("registered"),
                        p.get("last_error"),
                    ]
                    for p in pools
                ],
            ),
        ]
        # Fields the cluster does not store: the pool is published without them.
        for p in pools:
            if p.get("dropped_fields"):
                out.append(
                    f"  pool {p.get('pool')} of {p.get('driver')}: the cluster drops "
                    + ", ".join(p["dropped_fields"])
                )
    out += _cnr_lines(status.get("cnr"))
    out += _dynconfig_lines(status.get("dynconfig"))
    return "\n".join(out) + "\n"


def _cnr_lines(cnr: dict[str, Any] | None) -> list[str]:
    if not cnr or not (cnr.get("fields") or cnr.get("bad_fields")):
        return []
    state = "standalone" if cnr.get("synced") is None else "in sync" if cnr["synced"] else "pending"
    lines = [
        "",
        f"CNR: {len(cnr['fields'])} fields from {len(cnr.get('plugins') or [])} reporters, {state}"
        + (f", last error: {cnr['error']}" if cnr.get("error") else ""),
        "  " + ", ".join(cnr["fields"]),
    ]
    for b in cnr.get("bad_fields") or []:
        lines.append(f"  skipped {b.get('field')} from {b.get('plugin')}: {b.get('reason')}")
    return lines


def _dynconfig_lines(dyn: dict[str, Any] | None) -> list[str]:
    """assigned / active / last-known-good, as the KEP-281 status showed them, and why they
    differ."""
    if not dyn:
        return []

    def name(entry: dict[str, Any] | None) -> str:
        return "-" if not entry else f"{entry.get('name')} ({entry.get('hash')})"

    condition = dyn.get("condition") or {}
    lines = [
        "",
        f"Config: active {name(dyn.get('active'))}, assigned {name(dyn.get('assigned'))}, "
        f"last-known-good {name(dyn.get('last_known_good'))}",
        f"  {condition.get('reason')}: {condition.get('message')}",
    ]
    file = dyn.get("file") or {}
    if file.get("hash"):
        lines.insert(
            2, f"  config file {file['hash']}" + (", on trial" if file.get("on_trial") else "")
        )
    rollout = dyn.get("rollout") or {}
    if rollout.get("waiting"):
        # The assigned config's rollout (issue 31) does not admit this node yet.
        lines.append(
            f"  waiting for the rollout: {rollout.get('reason')}: {rollout.get('message')}"
        )
    lines += [f"  {why}" for why in dyn.get("differ") or []]
    return lines


def exit_code(status: dict[str, Any]) -> int:
    return EXIT_READY if status.get("ready") else EXIT_NOT_READY
