"""`stderr_is_journal`: the $JOURNAL_STREAM rule of systemd.exec(5) on real file descriptors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from nodeagent.log import StructuredFormatter, configure_logging, stderr_is_journal


def _stream_id(fd: int) -> str:
    stat = os.fstat(fd)
    return f"{stat.st_dev}:{stat.st_ino}"


def test_matches_only_the_named_stream(tmp_path: Path) -> None:
    with (tmp_path / "a").open("w") as a, (tmp_path / "b").open("w") as b:
        env = {"JOURNAL_STREAM": _stream_id(a.fileno())}
        assert stderr_is_journal(env, a.fileno())
        # Inherited by a process whose stderr is something else (a terminal, a file, a pipe).
        assert not stderr_is_journal(env, b.fileno())


def test_pipe_named_by_its_inode() -> None:
    read, write = os.pipe()
    try:
        assert stderr_is_journal({"JOURNAL_STREAM": _stream_id(write)}, write)
    finally:
        os.close(read)
        os.close(write)


def test_unset_malformed_or_closed_is_not_journal(tmp_path: Path) -> None:
    with (tmp_path / "a").open("w") as a:
        fd = a.fileno()
        assert not stderr_is_journal({}, fd)
        for value in ("", "12", "x:y", "1:2:3", ":"):
            assert not stderr_is_journal({"JOURNAL_STREAM": value}, fd), value
        stream = _stream_id(fd)
    assert not stderr_is_journal({"JOURNAL_STREAM": stream}, fd)  # closed now


def test_configure_logging_prefixes_only_for_journald(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin calling configure_logging() in a terminal gets no `<6>` prefixes; the same call
    under systemd, stderr being journald's stream, gets them."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level

    def prefixed() -> bool:
        configure_logging()
        (handler,) = root.handlers
        assert isinstance(handler.formatter, StructuredFormatter)
        return handler.formatter.priority_prefix

    try:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        assert prefixed() is False
        monkeypatch.setenv("JOURNAL_STREAM", _stream_id(2))
        assert prefixed() is True
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
