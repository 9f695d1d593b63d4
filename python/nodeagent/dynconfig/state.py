"""What dynamic configuration keeps across restarts: the assignment, last-known-good, the bad
configs and the trial marker. Its schema is the checkpoint's (format 1, JSON): a change here is a
change of what an upgraded agent reads at start.

Where it is kept (issue 29, a read-only or full state directory): in the checkpoint of the state
directory; while that cannot be written, in a copy in the runtime directory (`agent.runtime_dir`,
systemd's ``RuntimeDirectory``), which exists only while the checkpoint is behind (a write of the
checkpoint removes it) and is read first at a start. A trial marker written there but not in the
checkpoint could be lost with the runtime directory (a reboot) and a crash-inducing config then
not be blamed: a trial starts only once the checkpoint itself records it (the controller defers
it otherwise); the copy carries what happens after (a clean stop's time left, a promotion, a
rollback), so that a clean stop with the state directory read-only is not taken for a crash."""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.log import get_logger

__all__ = [
    "CHECKPOINT_NAME",
    "LOCAL",
    "LOCAL_HASH",
    "Assignment",
    "Bad",
    "BadKind",
    "Known",
    "Saved",
    "State",
    "Trial",
    "bad_file",
    "load",
    "load_runtime",
    "save",
]

log = get_logger(__name__)

CHECKPOINT_NAME = "dynconfig_state"
# The hash shown for the local config (defaults, file and flags without a remote overlay).
LOCAL_HASH = "local"
FORMAT = 1
# Bad configs remembered: only the newest matter (a retried object has a new key anyway).
BAD_KEPT = 32


class BadKind(enum.StrEnum):
    """Why a config is bad (the checkpoint stores the value)."""

    INVALID = "invalid"  # the agent's validation refused it
    VETO = "veto"  # a component (or a static field) refused the change
    UNHEALTHY = "unhealthy"  # rolled back during its trial
    CRASH = "crash"  # the agent died (or crash-looped) during its trial


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """The remote config this node's target object assigns (its ``spec.config``)."""

    name: str
    uid: str
    generation: int
    config: dict[str, Any]
    hash: str = ""

    @property
    def object_key(self) -> str:
        # A bad hash is retried once the object changes: another object, or a new generation.
        return f"{self.uid}/{self.generation}"


class Known(msgspec.Struct, frozen=True, kw_only=True):
    """A config the agent ran (active or last-known-good); `config` None is the local one."""

    hash: str
    name: str
    config: dict[str, Any] | None = None


LOCAL = Known(hash=LOCAL_HASH, name="local")


class Bad(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    object_key: str
    name: str
    kind: BadKind
    reason: str
    at: float


class Trial(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    name: str
    started_at: float  # wall clock, for the status
    # What is on trial: the remote config (`hash`, not yet last-known-good), a reloaded file
    # (`file_hash`, SIGHUP), or both; a rollback reverts both and marks both bad.
    remote: bool = True
    file_hash: str = ""
    # Seconds of the trial left when the agent stopped cleanly (SIGTERM, SIGINT): the next
    # start resumes the trial for that long. None while running: found at start, the agent died.
    remaining: float | None = None
    # Clean restarts during this trial (a failing liveness probe stops the agent cleanly too:
    # crashloop_restarts of them count as a crash).
    restarts: int = 0
    # The remote config on trial, recorded by a clean stop: the assignment may have moved on
    # meanwhile (an edit rejected as invalid keeps the trial running).
    config: dict[str, Any] | None = None
    # The fields (dotted paths) the trial changed: only a health signal these can cause rolls
    # it back (dynconfig.health.CAUSES). None: not known (a checkpoint of an older agent),
    # every signal counts.
    changed: list[str] | None = None
    # The config's object has a rollout (issue 31): surviving the trial does not make it
    # last-known-good until the rollout is Complete (it is held in `State.passed` meanwhile).
    rollout: bool = False


class State(msgspec.Struct, kw_only=True):
    version: int = FORMAT
    assigned: Assignment | None = None
    assigned_at: float | None = None
    lkg: Known | None = None
    lkg_at: float | None = None
    # A config of a rollout that survived its trial and runs, not yet last-known-good: its
    # rollout is not Complete (an abort returns to `lkg`). A restart starts from it.
    passed: Known | None = None
    bad: list[Bad] = msgspec.field(default_factory=list)
    # Written when a trial starts, cleared when it ends: found at start, the process died
    # during the trial.
    trial: Trial | None = None
    # The last time the apiserver confirmed the assignment: the checkpoint grace counts from it.
    confirmed_at: float | None = None
    # A reloaded file rolled back during its trial: a reload of the same content is refused
    # until the file changes.
    bad_file: Bad | None = None

    def bad_for(self, target: Assignment) -> Bad | None:
        """Why `target` (this hash of this object generation) was refused, if it was."""
        for bad in self.bad:
            if bad.hash == target.hash and bad.object_key == target.object_key:
                return bad
        return None

    def mark_bad(
        self, hash_: str, key: str, name: str, kind: BadKind, reason: str, at: float
    ) -> None:
        kept = [b for b in self.bad if b.hash != hash_]
        self.bad = [
            *kept[-(BAD_KEPT - 1) :],
            Bad(hash=hash_, object_key=key, name=name, kind=kind, reason=reason, at=at),
        ]


def bad_file(hash_: str, kind: BadKind, reason: str, at: float) -> Bad:
    """A reloaded config file that failed its trial."""
    return Bad(hash=hash_, object_key="file", name="file", kind=kind, reason=reason, at=at)


class Saved(enum.Enum):
    """Where `save` put the state."""

    CHECKPOINT = "checkpoint"  # the state directory's checkpoint (the runtime copy removed)
    RUNTIME = "runtime"  # only the runtime directory's copy: the checkpoint is behind
    NOTHING = "nothing"  # neither: a restart would see an older state


def load_runtime(runtime: CheckpointStore) -> State | None:
    """The runtime directory's copy of the state (None: none, or not usable), newer than the
    checkpoint whenever it exists."""
    loaded = load(runtime)
    if isinstance(loaded, State):
        log.warning(
            "dynconfig state read from the runtime directory: the state directory was not "
            "writable when it was last saved",
            path=str(runtime.directory),
        )
        return loaded
    if loaded != "no checkpoint":
        log.warning("dynconfig state in the runtime directory not used", reason=loaded)
    return None


def load(store: CheckpointStore) -> State | str:
    """The checkpointed state, or why there is none to start from."""
    try:
        read = store.read(CHECKPOINT_NAME)
    except OSError as exc:
        # A file that cannot be read (EIO, EACCES) is no start: the local config runs and the
        # boot's reason (logged, in the condition) says why; the store left the file as it is.
        return f"checkpoint unreadable: {exc.strerror or exc}"
    if read.state is CheckpointState.NOT_FOUND:
        return "no checkpoint"
    if read.state is CheckpointState.FOREIGN:
        return f"checkpoint of another node refused ({read.reason})"
    if read.state is CheckpointState.CORRUPT or read.data is None:
        return f"checkpoint corrupt ({read.reason})"
    try:
        state = msgspec.json.decode(read.data, type=State)
    except msgspec.DecodeError as exc:
        return f"checkpoint unreadable: {exc}"
    if state.version != FORMAT:
        return f"checkpoint format {state.version} unknown"
    return state


def save(store: CheckpointStore, state: State, runtime: CheckpointStore | None = None) -> Saved:
    """Write `state` to the checkpoint; if that fails (EROFS, ENOSPC, EIO: any OSError alike),
    to the runtime directory's copy (`runtime`; None: none configured)."""
    data = msgspec.json.encode(state)
    try:
        store.write(CHECKPOINT_NAME, data)
    except OSError as exc:
        # The store logged and counted it (its `problem` says it until a write succeeds).
        log.warning("dynconfig checkpoint not written", error=str(exc))
    else:
        if runtime is not None:
            try:
                runtime.remove(CHECKPOINT_NAME)  # the checkpoint is current again
            except OSError as exc:
                log.warning("dynconfig runtime copy not removed", error=str(exc))
        return Saved.CHECKPOINT
    if runtime is None:
        return Saved.NOTHING
    try:
        runtime.write(CHECKPOINT_NAME, data)
    except OSError as exc:
        log.warning("dynconfig state not written to the runtime directory", error=str(exc))
        return Saved.NOTHING
    return Saved.RUNTIME
