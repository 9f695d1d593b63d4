"""The Katalyst reporter plugin type: reporterplugin.v1alpha1 ListAndWatchReportContent, plus a
periodic unary GetReportContent poll of every registered reporter plugin (Katalyst's sync)."""

from __future__ import annotations

import json
import time
from contextlib import AbstractAsyncContextManager
from functools import cache
from typing import TYPE_CHECKING

import trio

from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.handler import InvalidMessage, PluginEndpoint, PluginValidationError
from nodeagent.plugins.security import UidCheck
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.streaming import StreamingHandler, _Entry, _rejection_kind, _Stream
from nodeagent.plugins.versions import require_any_version
from nodeagent.rpc.errors import MessageRejected, RpcError

if TYPE_CHECKING:
    from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2
    from nodeagent.rpc.bridge import GrpcBridge, GrpcChannel, ServerStream

__all__ = ["REPORTER_PLUGIN_TYPE", "SUPPORTED_VERSIONS", "ReporterHandler", "validate_report"]

log = get_logger(__name__)

REPORTER_PLUGIN_TYPE = "ReporterPlugin"
# The in-tree system reporter's name (nodeagent.reporter.system.SYSTEM_REPORTER_NAME), spelt out:
# plugins/ sits below reporter/ (tests/unit/test_layers.py). A plugin registering under the
# reporter's constant is seen refused in tests/plugins/test_reserved_reporter_name.py.
RESERVED_NAME = "system-reporter-plugin"
SUPPORTED_VERSIONS = ("v1alpha1",)
# Stream states in which the stream may still deliver. A stream being reopened counts: it
# passes through "open" on every attempt, so judging it by each failure would flap the plugin
# between live and stopped (and rewrite the reports' checkpoint each time); a plugin that is
# gone stops answering GetInfo probes and is deregistered instead.
_STREAM_DELIVERS = frozenset({"starting", "open", "backoff"})


class ReporterHandler(StreamingHandler["api_pb2.GetReportContentResponse"]):
    """Katalyst semantics: a plugin registering under a taken name replaces the older one.

    Besides the stream, every `report_poll_interval` each registered plugin's GetReportContent
    is called (all concurrently, each within `report_poll_timeout`); a reply goes through the
    same validation and into the same channel as a stream message, a failure keeps the last
    report. A plugin whose stream ended (or is unimplemented) is polled at once. It counts as
    live (`PluginData.live`) while its stream may deliver or its last poll answered.

    A poll belongs to the registration it polled (`_Entry.serial`): a plugin recreated at the
    same path registers with the same fields, and an answer the old process gives afterwards
    is neither the new registration's liveness nor its report. A new registration is polled at
    once even while a poll of the one it replaced still hangs.
    """

    plugin_type = REPORTER_PLUGIN_TYPE

    def __init__(
        self, bridge: GrpcBridge, settings: PluginSettings, *, uid_check: UidCheck | None = None
    ) -> None:
        super().__init__(bridge, settings, uid_check=uid_check)
        # By name: (the registration's serial, whether its last poll answered).
        self._poll_ok: dict[str, tuple[int, bool]] = {}
        self._polling: set[tuple[str, int]] = set()  # registrations with a poll in flight
        self.polls = 0  # polls answered with a valid report, ever

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        require_any_version(plugin.versions, SUPPORTED_VERSIONS)

    def validate(self, plugin: PluginEndpoint) -> None:
        super().validate(plugin)
        if plugin.name == RESERVED_NAME:
            # One report-store and checkpoint entry per name: it would replace the in-tree one.
            raise PluginValidationError(
                f"plugin name {RESERVED_NAME!r} is reserved for the agent's in-tree system "
                "reporter: register under another name"
            )

    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[api_pb2.GetReportContentResponse]]:
        # Here, not at the top: an idle node with no plugins never loads grpclib.
        from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc, api_pb2

        stub = channel.stub(api_grpc.ReporterPluginStub)
        return self._bridge.server_stream(stub.ListAndWatchReportContent, api_pb2.Empty())

    def validate_message(self, message: api_pb2.GetReportContentResponse) -> None:
        validate_report(message)

    # -- liveness and the poll -------------------------------------------------------------

    def live(self, entry: _Entry) -> bool:
        if not entry.registered:
            return False
        stream = entry.stream
        if stream is not None and stream.state in _STREAM_DELIVERS:
            return True
        return self._poll_ok.get(entry.plugin.name) == (entry.serial, True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(super().run)
            nursery.start_soon(self._poll_loop)
            task_status.started()

    def _forget(self, name: str) -> None:
        super()._forget(name)
        self._poll_ok.pop(name, None)

    def _set_state(self, stream: _Stream, state: str) -> None:
        super()._set_state(stream, state)
        entry = self._entries.get(stream.plugin.name)
        if entry is None or entry.stream is not stream:
            return
        if state in ("ended", "unimplemented") and self._nursery is not None:
            # The stream will not deliver again: poll now rather than at the next tick; that
            # poll's outcome says whether the plugin is still live (no flap in between).
            self._nursery.start_soon(self._poll, stream.plugin.name)

    def _republish(self, entry: _Entry) -> None:
        """Publish again when liveness changed (the message did not)."""
        data = self._data.get(entry.plugin.name)
        if data is not None and data.live != self.live(entry):
            self._publish(entry)

    async def _poll_loop(self) -> None:
        """Every interval, poll every registered plugin without waiting for the last round: a
        plugin that hangs until its timeout delays no one (nor is it polled twice at once)."""
        interval = self._settings.report_poll_interval
        while True:
            await trio.sleep(interval)
            nursery = self._nursery
            if nursery is None:
                continue
            for name, entry in list(self._entries.items()):
                if entry.registered and (name, entry.serial) not in self._polling:
                    nursery.start_soon(self._poll, name)

    async def _poll(self, name: str) -> None:
        """One GetReportContent call to the plugin serving `name`; never raises (but Cancelled)."""
        entry = self._entries.get(name)
        if entry is None or not entry.registered:
            return
        plugin, serial = entry.plugin, entry.serial
        if (name, serial) in self._polling:
            return
        self._polling.add((name, serial))
        try:
            message = await self._call(plugin)
        except MessageRejected as exc:  # oversized or malformed: counted like a stream's
            if self._still_serving(entry, serial):
                self._reject(entry, name, exc, _rejection_kind(exc))
            self._poll_failed(entry, serial, exc)
            return
        except RpcError as exc:
            self._poll_failed(entry, serial, exc)
            return
        except Exception as exc:  # a bug must not take the handler down: this poll fails
            log.exception("reporter poll crashed", plugin=name)
            self._poll_failed(entry, serial, exc)
            return
        finally:
            self._polling.discard((name, serial))
        if not self._still_serving(entry, serial):
            return
        try:
            self.validate_message(message)
        except Exception as exc:
            self._reject(entry, name, exc, "message_invalid")
            return
        self.polls += 1
        self._poll_ok[name] = (serial, True)
        if message == entry.last_message:
            # The usual answer of a plugin that also streams: nothing new to hand on.
            self._republish(entry)
            self.changes.set(None)
            return
        self._accept(entry, message)

    async def _call(self, plugin: PluginEndpoint) -> api_pb2.GetReportContentResponse:
        from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc, api_pb2

        settings = self._settings
        async with self._bridge.channel(
            plugin.endpoint,
            max_message_bytes=settings.max_message_bytes,
            check=self._connect_check,
        ) as channel:
            stub = channel.stub(api_grpc.ReporterPluginStub)
            return await self._bridge.unary(
                stub.GetReportContent, api_pb2.Empty(), timeout=settings.report_poll_timeout
            )

    def _still_serving(self, entry: _Entry, serial: int) -> bool:
        """The polled registration still serves its name (no re-registration meanwhile, even
        one equal by value: the same plugin recreated at the same path)."""
        name = entry.plugin.name
        return self._entries.get(name) is entry and entry.registered and entry.serial == serial

    def _poll_failed(self, entry: _Entry, serial: int, exc: Exception) -> None:
        if not self._still_serving(entry, serial):
            return
        name = entry.plugin.name
        metrics.ERRORS.labels(kind="report_poll").inc()
        was = self._poll_ok.get(name)
        self._poll_ok[name] = (serial, False)
        # Logged when the outcome changes, not every interval (a stream-only plugin never
        # answers the poll).
        if was != (serial, False):
            log.info("reporter poll failed; keeping the last report", plugin=name, error=str(exc))
        self._republish(entry)

    def _accept(self, entry: _Entry, message: api_pb2.GetReportContentResponse) -> None:
        entry.messages += 1
        self.messages_received += 1
        entry.last_message = message
        entry.last_message_time = time.time()
        self._messages_total.inc()
        self._publish(entry)


@cache
def _field_types() -> frozenset[int]:
    from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2

    return frozenset(api_pb2.FieldType.values())


def validate_report(message: api_pb2.GetReportContentResponse) -> None:
    """Every content names a kind, every field a name, a known type and a JSON value."""
    for i, content in enumerate(message.content):
        gvk = content.groupVersionKind
        where = f"content[{i}]"
        if not content.HasField("groupVersionKind") or not gvk.version or not gvk.kind:
            raise InvalidMessage(f"{where}.groupVersionKind: version and kind must be set")
        for j, field in enumerate(content.field):
            here = f"{where}.field[{j}]"
            if not field.fieldName:
                raise InvalidMessage(f"{here}.fieldName: must not be empty")
            if field.fieldType not in _field_types():
                raise InvalidMessage(f"{here}.fieldType: {field.fieldType}: unknown field type")
            try:
                json.loads(field.value)
            except (UnicodeDecodeError, ValueError) as exc:
                raise InvalidMessage(
                    f"{here}.value ({field.fieldName}): not valid JSON: {exc}"
                ) from None
