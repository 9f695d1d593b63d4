"""The streaming handler both built-in plugin types share (`plugins.handler.PluginHandler`).

It validates a plugin that asked to register, registers it (opening its list-and-watch stream in
a supervised task) and deregisters it. Validate, register and deregister for one plugin name run
strictly in sequence. The newest message of every plugin of the type is published on
`StreamingHandler.latest`, a `LatestValue` that a publisher reads.

Who serves each name (the newest of several live registrations during a rolling update) and
when a name that left is forgotten is the registration table's (`plugins.registrations`); this
module supervises the serving registration's stream: when the serving registration changes, the
stream is reopened on the new one.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.handler import PluginEndpoint, PluginValidationError
from nodeagent.plugins.registrations import NameEntry, RegistrationTable
from nodeagent.plugins.security import PeerRejected, UidCheck, allowed_uids_check, peer_check
from nodeagent.plugins.settings import PluginSettings
from nodeagent.rpc.errors import MalformedMessage, MessageRejected, MessageTooLarge, RpcError

if TYPE_CHECKING:
    # Type hints only: an idle node with no plugins loads neither protobuf's reflection nor the
    # bridge's grpclib side (see nodeagent.rpc).
    from google.protobuf.message import Message

    from nodeagent.rpc.bridge import GrpcBridge, GrpcChannel, ServerStream

__all__ = ["StreamingHandler"]

log = get_logger(__name__)

M = TypeVar("M", bound="Message")


@dataclass
class _Stream:
    plugin: PluginEndpoint
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    state: str = "starting"
    last_error: str = ""
    restarts: int = 0


@dataclass
class _Entry(NameEntry):
    """Everything kept about one plugin name (its registrations: `NameEntry`); it outlives
    streams and registrations."""

    stream: _Stream | None = None
    messages: int = 0
    rejected: int = 0
    skipped: int = 0
    last_message: Message | None = None
    last_message_time: float | None = None
    shown: tuple[Message, dict[str, Any]] | None = None  # last_message, rendered for status


class _Newest(Generic[M]):
    """The newest message read from a stream and not processed yet (older ones are dropped)."""

    def __init__(self) -> None:
        self.message: M | None = None
        self.arrived = trio.Event()
        self.last = -math.inf  # (Trio clock) when a message of the stream was last processed

    def put(self, message: M) -> bool:
        """Hold `message`; True if it superseded one that was never processed."""
        superseded = self.message is not None
        self.message = message
        self.arrived.set()
        return superseded

    def take(self) -> M | None:
        message, self.message = self.message, None
        self.arrived = trio.Event()
        return message


class StreamingHandler(ABC, Generic[M]):
    """A plugin type whose plugins push their state on one server-streaming call."""

    plugin_type: str
    # The manager's live settings (the hub's plugins table): stream_min_interval is read from
    # them at each message, so a change applies to running streams. None: the constructor's.
    live_settings: LatestValue[PluginSettings] | None = None

    def __init__(
        self, bridge: GrpcBridge, settings: PluginSettings, *, uid_check: UidCheck | None = None
    ) -> None:
        self._bridge = bridge
        self._settings = settings
        # Every connection a stream uses is checked: the endpoint may have been replaced since
        # the registration-time check.
        self._connect_check = peer_check(uid_check or allowed_uids_check(settings.allowed_uids))
        self._registrations: RegistrationTable[_Entry] = RegistrationTable(
            _Entry, settings.deregistered_data_grace
        )
        self._nursery: trio.Nursery | None = None
        self.latest: LatestValue[Mapping[str, PluginData]] = LatestValue(MappingProxyType({}))
        self._data: dict[str, PluginData] = {}  # what `latest` shows, by plugin name
        self.messages_received = 0  # valid messages over all plugins, ever
        self.messages_skipped = 0  # messages superseded before being processed, ever
        # Bumped on every change visible in plugin_status(), so callers can wait for one.
        self.changes: LatestValue[None] = LatestValue(None)
        # The per-message counters' children, looked up once (a labels() call per message is a
        # lock and a dict lookup on the plugin path).
        self._messages_total = metrics.MESSAGES.labels(type=self.plugin_type)
        self._skipped_total = metrics.MESSAGES_SKIPPED.labels(type=self.plugin_type)

    @property
    def _entries(self) -> dict[str, _Entry]:
        """Every plugin name the handler knows, registered or kept for its grace."""
        return self._registrations.entries

    # -- what a plugin type defines --------------------------------------------------------

    @abstractmethod
    def validate_versions(self, plugin: PluginEndpoint) -> None:
        """Raise PluginValidationError if the plugin's supported_versions are not acceptable."""

    @abstractmethod
    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[M]]:
        """Open `plugin`'s list-and-watch call on `channel` (the API its versions select)."""

    @abstractmethod
    def validate_message(self, message: M) -> None:
        """Raise InvalidMessage if the message's content breaks a rule."""

    def live(self, entry: _Entry) -> bool:
        """Whether the plugin still delivers (PluginData.live): a type with other ways to
        deliver than its stream decides more finely."""
        return entry.registered

    def streams(self, plugin: PluginEndpoint) -> bool:
        """Whether the agent streams from `plugin`; a type may have plugins that are only
        registered (no stream, nothing published for them)."""
        return True

    # -- the handler interface -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A plugin registered with an earlier run (a supervisor restarting the manager) is not
        # served any more: its stream died with that run. Those still there register again.
        self._forget_registrations()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._registrations.expire(self._forget)
        finally:
            self._nursery = None
            self._forget_registrations()

    def validate(self, plugin: PluginEndpoint) -> None:
        if not plugin.name:
            raise PluginValidationError("plugin name is empty")
        self.validate_versions(plugin)

    async def register(self, plugin: PluginEndpoint) -> None:
        if self._nursery is None:
            raise RuntimeError(f"{self.plugin_type} handler is not running")
        async with self._registrations.lock(plugin.name):
            entry = self._registrations.add(plugin)
            try:
                await self._serve(entry, plugin)
            except Exception:
                # Not registered after all: the manager does not deregister what failed here.
                entry.registrations.remove(plugin)
                raise

    async def deregister(self, plugin: PluginEndpoint) -> None:
        async with self._registrations.lock(plugin.name):
            removed = self._registrations.remove(plugin)
            if removed is None:
                return
            entry, serving = removed
            if not serving:
                self.changes.set(None)  # a standby registration left: nothing else changes
                return
            if entry.registrations:
                older = entry.registrations[-1]
                log.info(
                    "newest plugin registration left; serving the older one again",
                    plugin=plugin.name,
                    type=self.plugin_type,
                    socket=older.socket,
                    left=plugin.socket,
                )
                await self._serve(entry, older)
                return
            if entry.stream is not None:
                await self._stop(entry.stream)
                entry.stream = None
            self._registrations.left(entry, trio.current_time())
            self._publish(entry)

    def plugin_names(self) -> list[str]:
        return sorted(self._entries)

    def plugin_status(self, name: str, *, message: bool = True) -> dict[str, Any] | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        stream = entry.stream
        if stream is not None:
            state = stream.state
        elif entry.registered and not self.streams(entry.plugin):
            state = "self-publishing"
        else:
            state = "stopped"
        return {
            "owner_socket": entry.plugin.socket,
            "stream_state": state,
            "stream_error": stream.last_error if stream is not None else "",
            "stream_restarts": stream.restarts if stream is not None else 0,
            "messages_received": entry.messages,
            "messages_rejected": entry.rejected,
            "messages_skipped": entry.skipped,
            "last_message_time": entry.last_message_time,
            "last_message": self._shown(entry) if message else None,
        }

    def _shown(self, entry: _Entry) -> dict[str, Any] | None:
        """The last message as a dict, rendered once per message (a re-send is the same
        object). Shared between callers: one that changes it copies it first (the ops views
        do)."""
        if entry.last_message is None:
            return None
        if entry.shown is None or entry.shown[0] is not entry.last_message:
            entry.shown = (entry.last_message, _to_dict(entry.last_message))
        return entry.shown[1]

    # -- serving ---------------------------------------------------------------------------

    async def _serve(self, entry: _Entry, plugin: PluginEndpoint) -> None:
        """Make `plugin` the one serving its name: the previous stream goes, the data stays
        (until the new stream sends its own)."""
        # Before the first await: nothing started from here on is taken for the previous one's.
        entry.serve(plugin)
        if entry.stream is not None:
            await self._stop(entry.stream)
            entry.stream = None
        if self.streams(plugin):
            if self._nursery is None:
                raise RuntimeError(f"{self.plugin_type} handler is not running")
            entry.stream = _Stream(plugin)
            await self._nursery.start(self._supervise, entry, entry.stream)
        self._publish(entry)

    async def _stop(self, stream: _Stream) -> None:
        stream.cancel.cancel()
        await stream.done.wait()

    def _forget_registrations(self) -> None:
        now = trio.current_time()
        for entry in self._entries.values():
            if entry.registered or entry.stream is not None:
                if entry.stream is not None:
                    entry.stream.cancel.cancel()
                    entry.stream = None
                entry.registrations = []
                self._registrations.left(entry, now)
                self._publish(entry)

    def _forget(self, name: str) -> None:
        """A deregistered plugin's grace is over: its last data and status go."""
        self._registrations.drop(name)
        metrics.DATA_EXPIRED.labels(type=self.plugin_type).inc()
        log.info("deregistered plugin's data forgotten", plugin=name, type=self.plugin_type)
        if self._data.pop(name, None) is not None:
            self.latest.set(MappingProxyType(dict(self._data)))
        self.changes.set(None)

    def _publish(self, entry: _Entry) -> None:
        """Publish a new snapshot in which only `entry`'s plugin changed (O(1) per plugin, then
        one shallow copy, so many plugins streaming at once stay cheap)."""
        name = entry.plugin.name
        if entry.last_message is None or not self.streams(entry.plugin):
            # Nothing of ours to show: a plugin publishing its own state gets no entry at all
            # (not even an empty one, which a consumer could act on).
            if self._data.pop(name, None) is not None:
                self.latest.set(MappingProxyType(dict(self._data)))
        else:
            self._data[name] = PluginData(
                name=name,
                plugin_type=self.plugin_type,
                endpoint=entry.plugin.endpoint,
                message=entry.last_message,
                received_at=entry.last_message_time or 0.0,
                registered=entry.registered,
                live=self.live(entry),
            )
            self.latest.set(MappingProxyType(dict(self._data)))
        self.changes.set(None)

    # -- streams ---------------------------------------------------------------------------

    def _set_state(self, stream: _Stream, state: str) -> None:
        stream.state = state
        self.changes.set(None)

    async def _supervise(
        self,
        entry: _Entry,
        stream: _Stream,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the plugin's stream open until it ends cleanly, is unimplemented, or is stopped.

        Any failure, a bug included, fails this stream only: it is reported and reopened after
        the backoff, whose first retry is immediate; the backoff restarts only once a stream
        stayed open `stream_healthy_after` seconds, so a plugin failing right after each
        message is not retried (and logged) at full speed.
        """
        settings = self._settings
        # As the seed kubelet's plugin streams retried: the first retry at once, then doubling,
        # each delay in the upper half of its step so plugins failing together spread out.
        backoff = Backoff(
            settings.stream_backoff_initial,
            settings.stream_backoff_max,
            jitter=Jitter.below(0.5),
            immediate_first=True,
        )
        name = stream.plugin.name
        try:
            with stream.cancel:
                task_status.started()
                async with self._bridge.channel(
                    stream.plugin.endpoint,
                    max_message_bytes=settings.max_message_bytes,
                    check=self._connect_check,
                ) as channel:
                    while True:
                        opened_at: float | None = None
                        try:
                            async with self.open_stream(channel, stream.plugin) as messages:
                                opened_at = trio.current_time()
                                self._set_state(stream, "open")
                                await self._consume(entry, stream, messages)
                            self._set_state(stream, "ended")
                            log.info("plugin stream ended", plugin=name, type=self.plugin_type)
                            return
                        except RpcError as exc:
                            if exc.status == "UNIMPLEMENTED":
                                stream.last_error = str(exc)
                                self._set_state(stream, "unimplemented")
                                log.warning(
                                    "plugin does not implement its stream; stream stopped",
                                    plugin=name,
                                    type=self.plugin_type,
                                    error=str(exc),
                                )
                                return
                            kind: str | None = (
                                "peer_rejected" if isinstance(exc, PeerRejected) else "stream"
                            )
                            if isinstance(exc, MessageTooLarge):
                                kind = None  # counted as message_too_large when refused
                            error = str(exc)
                        except Exception as exc:
                            log.exception(
                                "plugin stream consumer crashed", plugin=name, type=self.plugin_type
                            )
                            kind, error = "stream_internal", f"internal error: {exc!r}"
                        healthy = opened_at is not None and (
                            trio.current_time() - opened_at >= settings.stream_healthy_after
                        )
                        if healthy:
                            backoff.reset()
                        await self._retry_later(stream, backoff, kind, error)
        finally:
            if stream.state not in ("ended", "unimplemented"):
                self._set_state(stream, "stopped")
            stream.done.set()

    async def _retry_later(
        self, stream: _Stream, backoff: Backoff, kind: str | None, error: str
    ) -> None:
        stream.last_error = error
        stream.restarts += 1
        delay = backoff.next()
        self._set_state(stream, "backoff")
        if kind is not None:
            metrics.ERRORS.labels(kind=kind).inc()
        metrics.STREAM_RESTARTS.labels(type=self.plugin_type).inc()
        log.warning(
            "plugin stream failed; reopening",
            plugin=stream.plugin.name,
            type=self.plugin_type,
            error=error,
            retry_in=round(delay, 3),
        )
        await trio.sleep(delay)

    async def _consume(self, entry: _Entry, stream: _Stream, messages: ServerStream[M]) -> None:
        """Read the stream in one task and process in another, the newest message winning: a
        flooding plugin's stale messages are skipped, not validated and published one by one.
        A message that is the newest one read, with nothing pending and the min interval past,
        is processed by the reader itself (no hand-over to the other task: the plugin path's
        latency). What is pending when the stream ends or fails is processed before that is
        reported."""
        pending: _Newest[M] = _Newest()
        failure: list[Exception] = []
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._process_loop, entry, stream, pending, failure, nursery)
            error = await self._read(entry, stream, messages, pending, failure)
            nursery.cancel_scope.cancel()
        if not failure:
            message = pending.take()
            if message is not None:
                self._guarded_process(entry, stream, message, failure)
        if failure:
            raise failure[0]
        if error is not None:
            raise error

    async def _read(
        self,
        entry: _Entry,
        stream: _Stream,
        messages: ServerStream[M],
        pending: _Newest[M],
        failure: list[Exception],
    ) -> Exception | None:
        """Read until the stream ends (None), fails (the error) or processing failed (None,
        the error in `failure`)."""
        while True:
            try:
                message = await messages.__anext__()
            except StopAsyncIteration:
                return None
            except MessageTooLarge as exc:
                # Refused from its length prefix, its body unread (and the stream reset by the
                # bridge): the stream is out of step, so it ends here and is reopened.
                self._reject(entry, stream.plugin.name, exc, "message_too_large")
                return exc
            except MessageRejected as exc:
                # The bytes were read in full, so the stream stays in step: skip just this one.
                self._reject(entry, stream.plugin.name, exc, _rejection_kind(exc))
                continue
            except Exception as exc:
                return exc
            if pending.message is None and _buffered(messages) == 0 and self._due(pending.last):
                # The newest message known and the processor idle: processed here, now.
                pending.last = trio.current_time()
                if not self._guarded_process(entry, stream, message, failure):
                    return None
                continue
            if pending.put(message):
                entry.skipped += 1
                self.messages_skipped += 1
                self._skipped_total.inc()

    async def _process_loop(
        self,
        entry: _Entry,
        stream: _Stream,
        pending: _Newest[M],
        failure: list[Exception],
        nursery: trio.Nursery,
    ) -> None:
        while True:
            # Also a checkpoint: the reader drains what already arrived before we take one.
            await pending.arrived.wait()
            if not self._due(pending.last):
                await self._min_interval_after(pending.last)
            message = pending.take()
            if message is None:
                continue
            pending.last = trio.current_time()
            if not self._guarded_process(entry, stream, message, failure):
                nursery.cancel_scope.cancel()
                return

    def _due(self, last: float) -> bool:
        """Whether stream_min_interval has passed since `last` (always, when it is 0: no clock
        read, no checkpoint)."""
        live = self.live_settings
        interval = (live.value if live is not None else self._settings).stream_min_interval
        return interval <= 0 or trio.current_time() >= last + interval

    async def _min_interval_after(self, last: float) -> None:
        """Sleep until stream_min_interval after `last`; a new interval (a reload) ends a wait
        begun with the old one (60 s -> 0.1 s)."""
        live = self.live_settings
        if live is None:
            await trio.sleep_until(last + self._settings.stream_min_interval)
            return
        while True:
            version, due = live.version, last + live.value.stream_min_interval
            with trio.move_on_at(due):
                await live.wait_newer(version)
                continue
            return

    def _guarded_process(
        self, entry: _Entry, stream: _Stream, message: M, failure: list[Exception]
    ) -> bool:
        """Process one message; a bug fails the stream (False, the error in `failure`)."""
        try:
            self._process(entry, stream, message)
        except Exception as exc:
            failure.append(exc)
            return False
        return True

    def _process(self, entry: _Entry, stream: _Stream, message: M) -> None:
        name = stream.plugin.name
        if message is entry.last_message:
            # The bytes of the message published last, sent again (the bridge's stream codec
            # hands back the same object): counted and timestamped, nothing validated,
            # converted or published. A plugin re-sending a large unchanged state at 10 Hz
            # would otherwise hold the GIL for most of every 100 ms.
            entry.messages += 1
            self.messages_received += 1
            entry.last_message_time = time.time()
            self._messages_total.inc()
            self.changes.set(None)  # the counts plugin_status shows
            return
        try:
            self.validate_message(message)
        except Exception as exc:  # InvalidMessage, or a validator bug: keep the last data
            self._reject(entry, name, exc, "message_invalid")
            return
        entry.messages += 1
        self.messages_received += 1
        entry.last_message = message
        entry.last_message_time = time.time()
        self._messages_total.inc()
        self._publish(entry)

    def _reject(self, entry: _Entry, name: str, exc: Exception, kind: str) -> None:
        entry.rejected += 1
        self.changes.set(None)
        metrics.ERRORS.labels(kind=kind).inc()
        log.warning(
            "plugin message rejected; keeping the last good data",
            plugin=name,
            type=self.plugin_type,
            kind=kind,
            error=str(exc),
        )


def _buffered(messages: object) -> int | None:
    """Messages already read ahead on the stream; None if the stream cannot tell (an async
    iterator other than the bridge's, a test double): then every message is handed over, and
    the processor's checkpoint lets what already arrived supersede it, as before."""
    buffered = getattr(messages, "buffered", None)
    return int(buffered()) if buffered is not None else None


def _rejection_kind(exc: MessageRejected) -> str:
    if isinstance(exc, MessageTooLarge):
        return "message_too_large"
    if isinstance(exc, MalformedMessage):
        return "message_malformed"
    return "message_invalid"


def _to_dict(message: Message) -> dict[str, Any]:
    # Imported on first use: json_format pulls in protobuf's pure-Python reflection.
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message)
