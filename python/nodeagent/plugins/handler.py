"""The per-plugin-type handler interface, and the streaming handler both built-in types share.

A handler validates a plugin that asked to register, registers it (opening its list-and-watch
stream in a supervised task) and deregisters it. Validate, register and deregister for one
plugin name run strictly in sequence. The newest message of every plugin of the type is
published on `StreamingHandler.latest`, a `LatestValue` that a publisher reads.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

import trio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.backoff import JitteredBackoff
from nodeagent.plugins.bridge import (
    GrpcBridge,
    GrpcChannel,
    MalformedMessage,
    MessageRejected,
    MessageTooLarge,
    RpcError,
    ServerStream,
)
from nodeagent.plugins.latest import LatestValue
from nodeagent.plugins.settings import PluginSettings

__all__ = [
    "InvalidMessage",
    "PluginData",
    "PluginEndpoint",
    "PluginHandler",
    "PluginValidationError",
    "StreamingHandler",
]

log = get_logger(__name__)

M = TypeVar("M", bound=Message)


class PluginValidationError(Exception):
    """The plugin's name, endpoint or versions are not acceptable; the message says why."""


class InvalidMessage(Exception):
    """A plugin message decoded but its content breaks a rule; the message says which."""


@dataclass(frozen=True)
class PluginEndpoint:
    """A plugin that answered GetInfo. `endpoint` is the resolved socket of its service."""

    name: str
    plugin_type: str
    socket: str
    endpoint: str
    versions: tuple[str, ...]


@dataclass(frozen=True)
class PluginData:
    """The last valid message of one plugin, as handed to consumers."""

    name: str
    plugin_type: str
    endpoint: str
    message: Message
    received_at: float  # wall-clock seconds
    registered: bool  # False once deregistered: the data is kept, marked stale


class PluginHandler(Protocol):
    """What the manager needs from a plugin type.

    Besides validate/register/deregister, a handler has `run` (hosts its stream tasks under the
    manager's nursery, so they die with the manager) and `plugin_status` (for the ops endpoint).
    """

    plugin_type: str
    latest: LatestValue[Mapping[str, PluginData]]

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None: ...

    def validate(self, plugin: PluginEndpoint) -> None:
        """Raise PluginValidationError if the plugin may not register."""

    async def register(self, plugin: PluginEndpoint) -> None: ...

    async def deregister(self, plugin: PluginEndpoint) -> None:
        """Stop serving `plugin`; a no-op if another socket has since taken over its name."""

    def plugin_status(self, name: str) -> dict[str, Any] | None: ...

    def plugin_names(self) -> list[str]: ...


@dataclass
class _Stream:
    plugin: PluginEndpoint
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    state: str = "starting"
    last_error: str = ""
    restarts: int = 0


@dataclass
class _Entry:
    """Everything kept about one plugin name; it outlives streams and registrations."""

    plugin: PluginEndpoint
    stream: _Stream | None = None
    messages: int = 0
    rejected: int = 0
    last_message: Message | None = None
    last_message_time: float | None = None
    registered: bool = False


class StreamingHandler(ABC, Generic[M]):
    """A plugin type whose plugins push their state on one server-streaming call."""

    plugin_type: str

    def __init__(self, bridge: GrpcBridge, settings: PluginSettings) -> None:
        self._bridge = bridge
        self._settings = settings
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None
        self.latest: LatestValue[Mapping[str, PluginData]] = LatestValue(MappingProxyType({}))
        self._data: dict[str, PluginData] = {}  # what `latest` shows, by plugin name
        self.messages_received = 0  # valid messages over all plugins, ever
        # Bumped on every change visible in plugin_status(), so callers can wait for one.
        self.changes: LatestValue[None] = LatestValue(None)

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

    # -- the handler interface -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def validate(self, plugin: PluginEndpoint) -> None:
        if not plugin.name:
            raise PluginValidationError("plugin name is empty")
        self.validate_versions(plugin)

    async def register(self, plugin: PluginEndpoint) -> None:
        if self._nursery is None:
            raise RuntimeError(f"{self.plugin_type} handler is not running")
        async with self._lock(plugin.name):
            entry = self._entries.get(plugin.name)
            if entry is not None and entry.stream is not None:
                # Re-registration (same or another socket): the old stream goes, its data stays.
                await self._stop(entry.stream)
            if entry is None:
                entry = self._entries[plugin.name] = _Entry(plugin)
            entry.plugin = plugin
            entry.registered = True
            entry.stream = _Stream(plugin)
            await self._nursery.start(self._supervise, entry, entry.stream)
            self._publish(entry)

    async def deregister(self, plugin: PluginEndpoint) -> None:
        async with self._lock(plugin.name):
            entry = self._entries.get(plugin.name)
            if entry is None or entry.plugin.socket != plugin.socket:
                return  # replaced by a newer registration of the same name
            if entry.stream is not None:
                await self._stop(entry.stream)
                entry.stream = None
            entry.registered = False
            self._publish(entry)

    def plugin_names(self) -> list[str]:
        return sorted(self._entries)

    def plugin_status(self, name: str) -> dict[str, Any] | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        stream = entry.stream
        return {
            "owner_socket": entry.plugin.socket,
            "stream_state": stream.state if stream is not None else "stopped",
            "stream_error": stream.last_error if stream is not None else "",
            "stream_restarts": stream.restarts if stream is not None else 0,
            "messages_received": entry.messages,
            "messages_rejected": entry.rejected,
            "last_message_time": entry.last_message_time,
            "last_message": (
                MessageToDict(entry.last_message) if entry.last_message is not None else None
            ),
        }

    # -- internals -------------------------------------------------------------------------

    def _lock(self, name: str) -> trio.Lock:
        return self._locks.setdefault(name, trio.Lock())

    async def _stop(self, stream: _Stream) -> None:
        stream.cancel.cancel()
        await stream.done.wait()

    def _set_state(self, stream: _Stream, state: str) -> None:
        stream.state = state
        self.changes.set(None)

    def _publish(self, entry: _Entry) -> None:
        """Publish a new snapshot in which only `entry`'s plugin changed (O(1) per plugin, then
        one shallow copy, so many plugins streaming at once stay cheap)."""
        if entry.last_message is not None:
            name = entry.plugin.name
            self._data[name] = PluginData(
                name=name,
                plugin_type=self.plugin_type,
                endpoint=entry.plugin.endpoint,
                message=entry.last_message,
                received_at=entry.last_message_time or 0.0,
                registered=entry.registered,
            )
        self.latest.set(MappingProxyType(dict(self._data)))
        self.changes.set(None)

    async def _supervise(
        self,
        entry: _Entry,
        stream: _Stream,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the plugin's stream open until it ends cleanly, is unimplemented, or is stopped."""
        backoff = JitteredBackoff(
            self._settings.stream_backoff_initial, self._settings.stream_backoff_max
        )
        name = stream.plugin.name
        try:
            with stream.cancel:
                task_status.started()
                async with self._bridge.channel(
                    stream.plugin.endpoint, max_message_bytes=self._settings.max_message_bytes
                ) as channel:
                    while True:
                        try:
                            async with self.open_stream(channel, stream.plugin) as messages:
                                self._set_state(stream, "open")
                                await self._consume(entry, stream, messages, backoff)
                            self._set_state(stream, "ended")
                            log.info("plugin stream ended", plugin=name, type=self.plugin_type)
                            return
                        except RpcError as exc:
                            if exc.status == "UNIMPLEMENTED":
                                self._set_state(stream, "unimplemented")
                                stream.last_error = str(exc)
                                log.warning(
                                    "plugin does not implement its stream; stream stopped",
                                    plugin=name,
                                    type=self.plugin_type,
                                    error=str(exc),
                                )
                                return
                            self._set_state(stream, "backoff")
                            stream.last_error = str(exc)
                            stream.restarts += 1
                            delay = backoff.next_delay()
                            metrics.ERRORS.labels(kind="stream").inc()
                            metrics.STREAM_RESTARTS.labels(type=self.plugin_type).inc()
                            log.warning(
                                "plugin stream failed; reopening",
                                plugin=name,
                                type=self.plugin_type,
                                error=str(exc),
                                retry_in=round(delay, 3),
                            )
                            await trio.sleep(delay)
        finally:
            if stream.state not in ("ended", "unimplemented"):
                self._set_state(stream, "stopped")
            stream.done.set()

    async def _consume(
        self, entry: _Entry, stream: _Stream, messages: ServerStream[M], backoff: JitteredBackoff
    ) -> None:
        name = stream.plugin.name
        while True:
            try:
                message = await messages.__anext__()
            except StopAsyncIteration:
                return
            except MessageRejected as exc:
                # The bytes were read in full, so the stream stays in step: skip just this one.
                self._reject(entry, name, exc, _rejection_kind(exc))
                continue
            try:
                self.validate_message(message)
            except Exception as exc:  # InvalidMessage, or a validator bug: keep the last data
                self._reject(entry, name, exc, "message_invalid")
                continue
            backoff.reset()
            entry.messages += 1
            self.messages_received += 1
            entry.last_message = message
            entry.last_message_time = time.time()
            metrics.MESSAGES.labels(type=self.plugin_type).inc()
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


def _rejection_kind(exc: MessageRejected) -> str:
    if isinstance(exc, MessageTooLarge):
        return "message_too_large"
    if isinstance(exc, MalformedMessage):
        return "message_malformed"
    return "message_invalid"
