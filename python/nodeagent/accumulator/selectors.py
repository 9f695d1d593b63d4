"""Label and field selectors, evaluated locally on objects written through the agent's client.

The server applies a query's selectors to its list and watch; an object the agent writes is
shown before the watch sees it only if it would pass the same selectors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_CMP = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")
_FIELD = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(==|=|!=)\s*(.*)$")

Op = Literal["in", "notin", "exists", "!exists"]


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: Op
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


def _split_top(text: str) -> list[str]:
    """Splits on commas outside parentheses (``a in (x,y),b`` has two requirements)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


class LabelSelector:
    """``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, comma-joined."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._reqs: list[_Requirement] = []
        if not text.strip():
            return
        for part in _split_top(text):
            self._reqs.append(self._parse(part))

    def _parse(self, part: str) -> _Requirement:
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            if not values:
                raise ValueError(f"label selector {self.text!r}: empty set in {part!r}")
            return _Requirement(m.group(1), "in" if m.group(2) == "in" else "notin", values)
        if m := _CMP.match(part):
            op: Op = "notin" if m.group(2) == "!=" else "in"
            return _Requirement(m.group(1), op, frozenset([m.group(3)]))
        if m := _EXISTS.match(part):
            return _Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset())
        raise ValueError(f"label selector {self.text!r}: cannot parse requirement {part!r}")

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self._reqs)


class FieldSelector:
    """``path=value``, ``path==value``, ``path!=value`` on JSON paths, comma-joined
    (``spec.nodeName=node-a,metadata.namespace!=kube-system``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._reqs: list[tuple[list[str], bool, str]] = []
        if not text.strip():
            return
        for part in (p.strip() for p in text.split(",")):
            m = _FIELD.match(part)
            if not m:
                raise ValueError(f"field selector {text!r}: cannot parse requirement {part!r}")
            self._reqs.append((m.group(1).split("."), m.group(2) != "!=", m.group(3).strip()))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((_field(obj, path) == value) == equal for path, equal, value in self._reqs)


def _field(obj: Mapping[str, Any], path: list[str]) -> str:
    cur: Any = obj
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return ""
        cur = cur[p]
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return "" if cur is None else str(cur)
