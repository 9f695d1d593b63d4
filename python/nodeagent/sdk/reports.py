"""Writing a Katalyst reporter plugin in a few lines.

```python
async with ReporterPlugin.serve(name="cpu-reporter", registry_dir=dir) as plugin:
    await plugin.report([ReportItem(group="node.katalyst.kubewharf.io", version="v1alpha1",
                              kind="CustomNodeResource", field_type="Status",
                              field_name="resources", value={...})])
```
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from grpclib.server import Stream

from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc, api_pb2
from nodeagent.rpc.bridge import GrpcBridge
from nodeagent.sdk._server import PluginServer, serving

__all__ = ["ReportItem", "ReporterPlugin", "build_report"]

FieldType = Literal["Spec", "Status", "Metadata"]


@dataclass(frozen=True)
class ReportItem:
    """One reported field: `value` is JSON-encoded as the Go field named `field_name`."""

    group: str
    version: str
    kind: str
    field_type: FieldType
    field_name: str
    value: Any


def build_report(items: Sequence[ReportItem]) -> api_pb2.GetReportContentResponse:
    """Group items by GroupVersionKind (first-seen order) into one response."""
    contents: dict[tuple[str, str, str], api_pb2.ReportContent] = {}
    for item in items:
        key = (item.group, item.version, item.kind)
        content = contents.get(key)
        if content is None:
            content = contents[key] = api_pb2.ReportContent()
            content.groupVersionKind.group = item.group
            content.groupVersionKind.version = item.version
            content.groupVersionKind.kind = item.kind
        content.field.append(
            api_pb2.ReportField(
                fieldType=item.field_type,
                fieldName=item.field_name,
                value=json.dumps(item.value, separators=(",", ":")).encode(),
            )
        )
    return api_pb2.GetReportContentResponse(content=list(contents.values()))


class _ReporterService(api_grpc.ReporterPluginBase):
    def __init__(self, plugin: ReporterPlugin) -> None:
        self._plugin = plugin

    async def GetReportContent(
        self, stream: Stream[api_pb2.Empty, api_pb2.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        latest = self._plugin.latest.value
        await stream.send_message(latest or api_pb2.GetReportContentResponse())

    async def ListAndWatchReportContent(
        self, stream: Stream[api_pb2.Empty, api_pb2.GetReportContentResponse]
    ) -> None:
        await self._plugin._stream_updates(stream)


class ReporterPlugin(PluginServer[api_pb2.GetReportContentResponse]):
    """A reporter plugin serving Registration and ReporterPlugin on `<registry_dir>/<name>.sock`."""

    plugin_type = "ReporterPlugin"

    def services(self) -> list[Any]:
        return [_ReporterService(self)]

    async def report(self, items: Sequence[ReportItem]) -> None:
        """Replace the plugin's whole report; every open stream sends it."""
        await self.publish_message(build_report(items))

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        *,
        name: str,
        registry_dir: str,
        versions: Sequence[str] = ("v1alpha1",),
        bridge: GrpcBridge | None = None,
    ) -> AsyncIterator[ReporterPlugin]:
        """Serve until the block exits, then remove the socket. Without `bridge`, opens one."""
        plugin = cls(
            name, _socket_path(registry_dir, f"{name}.sock"), "", versions
        )  # empty endpoint: the registration socket
        async with serving(plugin, bridge, separate_endpoint=False):
            yield plugin


def _socket_path(registry_dir: str, filename: str) -> str:
    return os.path.join(os.path.abspath(registry_dir), filename)
