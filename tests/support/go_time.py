"""`metav1.Time` as kube-apiserver decodes it from JSON (Go's `time.Parse(time.RFC3339, s)`),
in plain Python: the reference of the Rust `parse_rfc3339` (rust/src/inventory/names.rs) that
the validator and the planner use. Go's parser is laxer than RFC 3339 in places (a one-digit
hour, a fraction after ',' or '.' of any length, cut to nanoseconds; year 0000; offsets up to
24:00 and minutes up to 60) and strict in others (a real calendar day, hour < 24, minute and
second < 60, an uppercase 'T' and 'Z'); each was checked against kube-apiserver 1.37."""

from __future__ import annotations

import re
from datetime import date

__all__ = ["is_rfc3339", "parse_rfc3339"]

_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(Z|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
_EPOCH = date(1970, 1, 1).toordinal()
_CYCLE = 146_097  # days in 400 Gregorian years


def parse_rfc3339(s: str) -> int | None:
    """Nanoseconds since the epoch, or None where the server answers 400."""
    m = _TIME.fullmatch(s)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction, zone = m.group(7) or "", m.group(8)
    if not (1 <= month <= 12 and hour < 24 and minute < 60 and second < 60):
        return None
    offset = 0
    if zone != "Z":
        oh, om = int(zone[1:3]), int(zone[4:6])
        if oh > 24 or om > 60:
            return None
        offset = (oh * 3600 + om * 60) * (-1 if zone[0] == "-" else 1)
    try:
        # Year 0 has year 400's calendar (both leap years); date() starts at year 1.
        days = date(year or 400, month, day).toordinal() - _EPOCH - (_CYCLE if year == 0 else 0)
    except ValueError:
        return None
    nanos = int((fraction[:9] or "0").ljust(9, "0"))
    return (days * 86_400 + hour * 3600 + minute * 60 + second - offset) * 10**9 + nanos


def is_rfc3339(s: str) -> bool:
    return parse_rfc3339(s) is not None
