"""The Katalyst reporter plugin type: reporterplugin.v1alpha1 ListAndWatchReportContent."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager

from nodeagent.plugins.handler import InvalidMessage, PluginEndpoint, StreamingHandler
from nodeagent.plugins.versions import require_any_version
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc, api_pb2
from nodeagent.rpc.bridge import GrpcChannel, ServerStream

__all__ = ["REPORTER_PLUGIN_TYPE", "SUPPORTED_VERSIONS", "ReporterHandler", "validate_report"]

REPORTER_PLUGIN_TYPE = "ReporterPlugin"
SUPPORTED_VERSIONS = ("v1alpha1",)


class ReporterHandler(StreamingHandler[api_pb2.GetReportContentResponse]):
    """Katalyst semantics: a plugin registering under a taken name replaces the older one."""

    plugin_type = REPORTER_PLUGIN_TYPE

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        require_any_version(plugin.versions, SUPPORTED_VERSIONS)

    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[api_pb2.GetReportContentResponse]]:
        stub = channel.stub(api_grpc.ReporterPluginStub)
        return self._bridge.server_stream(stub.ListAndWatchReportContent, api_pb2.Empty())

    def validate_message(self, message: api_pb2.GetReportContentResponse) -> None:
        validate_report(message)


_FIELD_TYPES = frozenset(api_pb2.FieldType.values())


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
            if field.fieldType not in _FIELD_TYPES:
                raise InvalidMessage(f"{here}.fieldType: {field.fieldType}: unknown field type")
            try:
                json.loads(field.value)
            except (UnicodeDecodeError, ValueError) as exc:
                raise InvalidMessage(
                    f"{here}.value ({field.fieldName}): not valid JSON: {exc}"
                ) from None
