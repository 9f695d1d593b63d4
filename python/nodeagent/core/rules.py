"""Validation rules shared by every package's settings."""

from __future__ import annotations

import math

from nodeagent.core.errors import ConfigError

__all__ = ["MAX_UID", "MIN_SECONDS", "check_seconds", "check_uid"]

# The shortest interval or timeout any setting takes: 1 ms. Shorter ones are mistakes (a
# heartbeat of 1e-9 s is a busy loop); a setting may ask for a larger minimum.
MIN_SECONDS = 0.001
# uid_t is 32 bits and (uid_t)-1 means "no UID" to the kernel (chown, setresuid).
MAX_UID = 2**32 - 2


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
