"""Structured logging for nodeagent.

Every component logs through `get_logger(__name__)` and passes fields as keyword arguments:
``log.warning("watch failed", resource="configmaps", error=str(exc))``. The formatter renders
them as ``key=value`` pairs or one JSON object per line; when stderr is journald's stream
(`stderr_is_journal`) each line is prefixed with the syslog priority (``<4>``) so journald keeps
the level.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

LogFormat = Literal["text", "json"]

# syslog priorities (journald reads "<N>" prefixes on stderr lines, SyslogLevelPrefix=true).
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def _priority(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _PRIORITY[level]
    return _PRIORITY[logging.DEBUG]


class Logger:
    """A thin wrapper over `logging.Logger` that takes structured fields as keywords."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, exc_info=exc_info, extra={"fields": fields}, stacklevel=3)

    def debug(self, msg: str, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, **fields: Any) -> None:
        self._log(logging.ERROR, msg, False, fields)

    def exception(self, msg: str, **fields: Any) -> None:
        """Log at ERROR with the current exception's traceback."""
        self._log(logging.ERROR, msg, True, fields)

    def is_enabled_for(self, level: int) -> bool:
        return self._logger.isEnabledFor(level)


def get_logger(name: str) -> Logger:
    return Logger(name)


# What a terminal or log viewer would act on rather than show: C0 controls (ESC starts escape
# sequences, CR rewrites the line, LF forges a new record, BEL rings), DEL, C1 controls (0x9b is
# a one-byte CSI), the Unicode line/paragraph separators and the bidirectional overrides and
# isolates (text that reads differently from what it is).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str, *, keep: str = "") -> str:
    """`text` with every control character (and Unicode line separator or bidi override) shown
    as an escape (``\\x1b``, ``\\r``, ``\\u202e``), so untrusted text (a plugin's name, an error
    it sent) cannot drive the terminal or forge log lines. Characters in `keep` stay as they
    are (e.g. the newlines of a table the program itself laid out)."""
    if not _UNSAFE.search(text):
        return text
    if keep:
        return "".join(
            part if part in keep else _UNSAFE.sub(_escape_one, part)
            for part in re.split(f"([{re.escape(keep)}])", text)
        )
    return _UNSAFE.sub(_escape_one, text)


def _text_value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        text = json.dumps(text)  # escapes C0 controls itself
    return escape_control(text)


class StructuredFormatter(logging.Formatter):
    """Renders records as ``<P>ts level logger msg k=v ...`` or as one JSON object per line."""

    def __init__(self, fmt: LogFormat = "text", *, priority_prefix: bool = True) -> None:
        super().__init__()
        self.fmt = fmt
        self.priority_prefix = priority_prefix

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = dict(getattr(record, "fields", None) or {})
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        if self.fmt == "json":
            doc = {
                "ts": ts,
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
                **{
                    k: v if isinstance(v, int | float | bool | None) else str(v)
                    for k, v in fields.items()
                },
            }
            # json.dumps escapes C0 controls and (ASCII output) C1 and bidi characters; DEL is
            # the one control it leaves raw.
            line = json.dumps(doc, separators=(",", ":")).replace("\x7f", "\\u007f")
        else:
            parts = [ts, record.levelname.lower(), record.name, _text_value(record.getMessage())]
            parts += [f"{escape_control(k)}={_text_value(v)}" for k, v in fields.items()]
            line = " ".join(parts)
        if self.priority_prefix:
            # Multi-line values (tracebacks) stay one record: escape newlines in text mode.
            line = f"<{_priority(record.levelno)}>" + line.replace("\n", "\\n")
        return line


def stderr_is_journal(environ: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """True when `fd` (stderr) is the stream systemd connected to journald.

    systemd sets ``$JOURNAL_STREAM`` to that stream's ``<device>:<inode>`` (systemd.exec(5)).
    The variable alone is not enough: a shell in a terminal started by a systemd user service
    (GNOME Terminal, tmux under systemd-run) inherits it while its stderr is a terminal, where
    ``<N>`` prefixes would only be noise.
    """
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, sep, inode = value.partition(":")
    if not sep:
        return False
    try:
        stat = os.fstat(fd)
        return (int(device), int(inode)) == (stat.st_dev, stat.st_ino)
    except (ValueError, OSError):
        return False


def configure_logging(
    level: str = "info", fmt: LogFormat = "text", *, priority_prefix: bool | None = None
) -> None:
    """Send all nodeagent logs to stderr with the given level and format. `priority_prefix`
    (``<N>`` syslog priorities, which journald reads): by default only when stderr is
    journald's stream, never on a terminal (plugins written on the SDK call this too)."""
    if priority_prefix is None:
        priority_prefix = stderr_is_journal()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(fmt, priority_prefix=priority_prefix))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_log_level(level)


def set_log_level(level: str) -> None:
    """Change the level of every nodeagent log at once (also at run time: a config reload)."""
    logging.getLogger().setLevel(level.upper())
    # Third-party chatter stays at WARNING unless we debug.
    for noisy in ("httpx", "httpcore", "hpack", "grpclib", "asyncio", "trio_asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
