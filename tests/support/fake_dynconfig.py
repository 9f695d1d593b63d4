"""Fakes for the dynamic-config controller: a hub over a plain dict config, its builder and
hasher (two fields, `log_level` and `interval`; any other is invalid), the supervisor's reports
and a settable wall clock."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.core.errors import ConfigError

LOCAL = {"log_level": "info", "interval": 5}


def build(remote: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(LOCAL)
    for key, value in (remote or {}).items():
        if key not in LOCAL:
            raise ConfigError(key, value, "unknown or static field")
        out[key] = value
    return out


def hasher(remote: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(remote, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Result:
    applied: bool
    vetoes: list[tuple[str, str]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


@dataclass
class FakeHub:
    current: dict[str, Any]
    veto: str | None = None
    proposals: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    def propose(self, new: dict[str, Any], source: str) -> Result:
        self.proposals.append((new, source))
        if self.veto is not None and new.get("interval") == 99:
            return Result(False, [("publisher", self.veto)])
        changed = sorted(k for k in new if new[k] != self.current.get(k))
        self.current = new
        return Result(True, changed=changed)


@dataclass(frozen=True)
class Report:
    name: str
    ready: bool = True
    reason: str = "ok"
    restarts: int = 0


class Wall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now
