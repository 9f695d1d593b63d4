"""Validation rules shared by every package's settings.

A range msgspec can say is a typed constraint (`NonNegative`, `finite`): declared once in the
field's type, enforced by msgspec when the config is decoded, by `check_constraints` for
settings built in code (a Struct's constructor checks nothing), and named in the error by its
`rule` text, which the config loader puts in place of msgspec's own message."""

from __future__ import annotations

import math
import sys
import typing
from typing import Annotated, Any

import msgspec

from nodeagent.core.errors import ConfigError

__all__ = [
    "MAX_UID",
    "MIN_SECONDS",
    "AtLeastOne",
    "Count",
    "NonNegative",
    "check_constraints",
    "check_seconds",
    "check_uid",
    "constraint_rule",
    "count",
    "finite",
]

# The shortest interval or timeout any setting takes: 1 ms. Shorter ones are mistakes (a
# heartbeat of 1e-9 s is a busy loop); a setting may ask for a larger minimum.
MIN_SECONDS = 0.001
# uid_t is 32 bits and (uid_t)-1 means "no UID" to the kernel (chown, setresuid).
MAX_UID = 2**32 - 2

# The key of a constraint's rule text in `msgspec.Meta.extra`.
RULE = "rule"


def finite(*, ge: float, rule: str | None = None) -> msgspec.Meta:
    """A finite float >= `ge`. msgspec has no finiteness constraint: the largest float as the
    upper bound refuses inf, and NaN fails every comparison."""
    return msgspec.Meta(
        ge=ge, le=sys.float_info.max, extra={RULE: rule or f"must be a finite number >= {ge:g}"}
    )


def count(*, ge: int, le: int | None = None, rule: str | None = None) -> msgspec.Meta:
    """An integer >= `ge` (and <= `le` if given)."""
    if rule is None:
        rule = f"must be >= {ge}" if le is None else f"must be in {ge}..{le}"
    return msgspec.Meta(ge=ge, le=le, extra={RULE: rule})


# Seconds (or a count) where 0 means "at once" or "no wait": any finite value >= 0.
NonNegative = Annotated[float, finite(ge=0)]
# A number of things where 0 means none, and one where at least one is needed.
Count = Annotated[int, count(ge=0)]
AtLeastOne = Annotated[int, count(ge=1)]


def _constraint(annotation: Any) -> tuple[msgspec.Meta, str] | None:
    """The typed constraint of a field's annotation and its rule text (None: none)."""
    if typing.get_origin(annotation) is not Annotated:
        return None
    for meta in typing.get_args(annotation)[1:]:
        if isinstance(meta, msgspec.Meta) and meta.extra and RULE in meta.extra:
            return meta, str(meta.extra[RULE])
    return None


def constraint_rule(owner: type[msgspec.Struct], name: str) -> str | None:
    """The rule text of field `name`'s typed constraint (None: it has none)."""
    for f in msgspec.structs.fields(owner):
        if f.name == name:
            constraint = _constraint(f.type)
            return None if constraint is None else constraint[1]
    return None


def _within(value: Any, meta: msgspec.Meta) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return (
        (meta.ge is None or value >= meta.ge)
        and (meta.gt is None or value > meta.gt)
        and (meta.le is None or value <= meta.le)
        and (meta.lt is None or value < meta.lt)
    )


def check_constraints(settings: msgspec.Struct, section: str) -> None:
    """Raise ConfigError naming the first field of `settings` outside its typed constraint."""
    for f in msgspec.structs.fields(type(settings)):
        constraint = _constraint(f.type)
        value = getattr(settings, f.name)
        if constraint is not None and not _within(value, constraint[0]):
            raise ConfigError(f"{section}.{f.name}", value, constraint[1])


def check_seconds(
    field: str, value: float, *, minimum: float = MIN_SECONDS, maximum: float | None = None
) -> None:
    """A duration in seconds: finite, at least `minimum`, at most `maximum` if given."""
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(field, value, "must be a finite number > 0")
    if value < minimum:
        raise ConfigError(field, value, f"must be >= {minimum:g} (seconds)")
    if maximum is not None and value > maximum:
        raise ConfigError(field, value, f"must be <= {maximum:g}")


def check_uid(field: str, uid: int) -> None:
    if not 0 <= uid <= MAX_UID:
        raise ConfigError(field, uid, f"a UID must be >= 0 and <= {MAX_UID}")
