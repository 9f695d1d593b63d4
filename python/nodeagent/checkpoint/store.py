"""`CheckpointStore`: named checkpoints in one directory, written atomically, read three ways."""

from __future__ import annotations

import contextlib
import enum
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nodeagent.checkpoint import metrics
from nodeagent.checkpoint.format import CorruptCheckpoint, decode_with_node, encode
from nodeagent.core.errors import ConfigError
from nodeagent.log import get_logger

__all__ = ["CheckpointRead", "CheckpointState", "CheckpointStore", "check_name"]

log = get_logger(__name__)

# The kubelet checkpointmanager's key rule (pkg/kubelet/util/store): the name is the file name.
# Shorter than the kubelet's 250: "<name>.corrupt-<UTC time>" must fit Linux's 255-byte names.
NAME_MAX = 200
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# Reserved so that a file moved aside can never be taken for (or replaced by) a checkpoint.
_CORRUPT_MARK = ".corrupt-"
# mkstemp's names: "." + name + "." + 8 random characters + ".tmp".
_TEMP_SUFFIX = r"[a-z0-9_]{8}\.tmp"


class CheckpointState(enum.Enum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    CORRUPT = "corrupt"
    # Written by another node (the file is left alone: this node's next write replaces it).
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class CheckpointRead:
    """The outcome of `CheckpointStore.read`: `data` only when FOUND; `reason` when CORRUPT or
    FOREIGN; `moved_to` only when CORRUPT (None if the file could not be moved aside)."""

    state: CheckpointState
    data: bytes | None = None
    moved_to: Path | None = None
    reason: str | None = None


def check_name(name: str) -> None:
    """Raise ConfigError unless `name` is a valid checkpoint name."""
    if not name or len(name) > NAME_MAX or _NAME.fullmatch(name) is None:
        raise ConfigError(
            "checkpoint name",
            name,
            f"must be 1-{NAME_MAX} characters of [A-Za-z0-9-_.], starting and ending with a "
            "letter or digit (the kubelet checkpoint key rule, 200 not 250 characters)",
        )
    if _CORRUPT_MARK in name:
        raise ConfigError(
            "checkpoint name", name, f"must not contain {_CORRUPT_MARK!r} (kept for corrupt files)"
        )


class CheckpointStore:
    """Named checkpoints, one file each, in `directory` (created on the first write).

    Synchronous and thread-safe (callers in Trio use `trio.to_thread.run_sync`); one lock
    serialises the operations, so a corrupt file is never moved aside while a write replaces it.
    Several stores may share the directory, each with its own names: the leftover temporary
    files of a killed writer are removed by a store's first operation on that name (never those
    of another name: another store's write in progress).

    With `node`, checkpoints record the node that writes them and one written by another node
    reads as FOREIGN (logged, counted): a state directory reused under another node name (a
    renamed node, a cloned disk image) hands nothing of the other node's state to this one.

    `read_only` (a dry run, `agent.dry_run`): reads as usual, but nothing in the directory
    changes: writes are skipped (logged), a corrupt file is reported but not moved aside and
    leftover temporary files are left alone.
    """

    def __init__(
        self,
        directory: Path,
        *,
        keep_corrupt: int = 3,
        node: str | None = None,
        read_only: bool = False,
    ) -> None:
        if keep_corrupt < 1:
            raise ConfigError("keep_corrupt", keep_corrupt, "must be >= 1")
        if node is not None:
            try:
                encode(b"", node)
            except ValueError as exc:
                raise ConfigError("checkpoint node", node, str(exc)) from None
        self.directory = directory
        self.node = node
        self.read_only = read_only
        self._keep_corrupt = keep_corrupt
        self._lock = threading.Lock()
        self._swept: set[str] = set()
        # What this store last failed to do in the directory (a leftover not removed, a write
        # not made), for the agent's status; None again after a successful write.
        self.problem: str | None = None

    def path(self, name: str) -> Path:
        check_name(name)
        return self.directory / name

    def write(self, name: str, data: bytes) -> None:
        """Replace checkpoint `name` with `data` atomically and durably.

        The new content goes to a dot-file in the same directory, is fsynced, renamed over the
        old file and the directory is fsynced: a crash at any point leaves the old or the new
        checkpoint. On an OSError the temporary file is removed, the old checkpoint is kept,
        the failure is logged and counted, and the error is raised."""
        path = self.path(name)
        if self.read_only:
            log.debug("dry run: checkpoint not written", name=name, path=str(path))
            return
        with self._lock:
            try:
                self._sweep_once(name)
                self._ensure_directory()
                _write_atomically(path, encode(data, self.node))
            except OSError as exc:
                self.problem = f"checkpoint {name} not written: {exc.strerror or exc}"
                metrics.WRITE_FAILURES.labels(name).inc()
                log.warning("checkpoint write failed", name=name, path=str(path), error=str(exc))
                raise
            self.problem = None

    def remove(self, name: str) -> None:
        """Remove checkpoint `name` (none there: nothing to do); an OSError is raised."""
        path = self.path(name)
        if self.read_only:
            return
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return
            _fsync_directory(self.directory)

    def _ensure_directory(self) -> None:
        if self.directory.is_dir():
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A new directory's own entry is durable only once its parent is fsynced.
        _fsync_directory(self.directory.parent)

    def read(self, name: str) -> CheckpointRead:
        """FOUND with the data, NOT_FOUND, or CORRUPT (the file moved aside, logged, counted).

        Raises OSError for I/O errors other than a missing file (the content was not judged)."""
        path = self.path(name)
        with self._lock:
            self._sweep_once(name)
            try:
                blob = path.read_bytes()
            except FileNotFoundError:
                return CheckpointRead(CheckpointState.NOT_FOUND)
            try:
                data, node = decode_with_node(blob)
            except CorruptCheckpoint as exc:
                return self._quarantine(name, path, exc.reason)
            if self.node is not None and node is not None and node != self.node:
                reason = f"written by node {node}, this is node {self.node}"
                metrics.FOREIGN.labels(name).inc()
                log.error(
                    "checkpoint of another node: not used (a state directory reused under "
                    "another node name?); this node's next write replaces it",
                    name=name,
                    path=str(path),
                    written_by=node,
                    node=self.node,
                )
                return CheckpointRead(CheckpointState.FOREIGN, reason=reason)
            return CheckpointRead(CheckpointState.FOUND, data=data)

    def _quarantine(self, name: str, path: Path, reason: str) -> CheckpointRead:
        metrics.CORRUPT.labels(name).inc()
        if self.read_only:
            log.warning("checkpoint corrupt (dry run: left in place)", name=name, reason=reason)
            return CheckpointRead(CheckpointState.CORRUPT, reason=reason)
        try:
            moved_to: Path | None = self._move_aside(name, path)
        except OSError as exc:
            log.error(
                "checkpoint corrupt and could not be moved aside",
                name=name,
                path=str(path),
                reason=reason,
                error=str(exc),
            )
            moved_to = None
        else:
            log.warning(
                "checkpoint corrupt, moved aside",
                name=name,
                path=str(path),
                reason=reason,
                moved_to=str(moved_to),
            )
        return CheckpointRead(CheckpointState.CORRUPT, moved_to=moved_to, reason=reason)

    def _move_aside(self, name: str, path: Path) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.directory / f"{name}{_CORRUPT_MARK}{stamp}"
        counter = 1
        while target.exists():  # rename() would replace it silently
            counter += 1
            target = self.directory / f"{name}{_CORRUPT_MARK}{stamp}-{counter}"
        path.rename(target)
        _fsync_directory(self.directory)
        self._prune_corrupt(name)
        return target

    def _prune_corrupt(self, name: str) -> None:
        """Keep the newest `keep_corrupt` files moved aside for `name` (a corrupting disk or a
        crash loop must not fill the state directory)."""
        pattern = re.compile(re.escape(name + _CORRUPT_MARK) + r"(\d{8}T\d{6}\.\d{6}Z)(?:-(\d+))?")
        found: list[tuple[str, int, Path]] = []
        for entry in self.directory.iterdir():
            match = pattern.fullmatch(entry.name)
            if match is not None:
                found.append((match[1], int(match[2] or 1), entry))
        found.sort()
        for _, _, old in found[: -self._keep_corrupt]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()

    def _sweep_once(self, name: str) -> None:
        if name in self._swept or self.read_only:
            return
        # Only this name's: another store's write in progress in the shared directory is not a
        # leftover (its rename would fail and the checkpoint silently stay old).
        pattern = re.compile(re.escape(f".{name}.") + _TEMP_SUFFIX)
        # Swept once even when it fails: a leftover is never read (a write makes its own), so a
        # read-only directory (EROFS) or one not ours (EACCES) is reported, not fatal: the reads
        # go on from what is there, and its writes fail (reported) on their own.
        self._swept.add(name)
        try:
            entries = list(self.directory.iterdir())
        except FileNotFoundError:
            entries = []
        except OSError as exc:
            problem = f"{self.directory} not listed for leftovers: {exc.strerror or exc}"
            self._sweep_failed(name, problem)
            return
        for entry in entries:
            if pattern.fullmatch(entry.name) is None:
                continue
            try:
                entry.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                problem = f"leftover temp file {entry} not removed: {exc.strerror or exc}"
                self._sweep_failed(name, problem)
                continue
            log.info("removed a leftover checkpoint temp file", path=str(entry))

    def _sweep_failed(self, name: str, problem: str) -> None:
        self.problem = problem
        metrics.SWEEP_FAILURES.labels(name).inc()
        log.error(
            "leftover checkpoint temp file not removed (a read-only state directory?); "
            "checkpoints are read, writes will fail",
            name=name,
            problem=problem,
        )


def _write_atomically(path: Path, content: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    # After the rename: the new name is durable only once the directory entry is.
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
