"""Writing a seed (v1alpha3) DRA device plugin in a few lines.

```python
async with DevicePlugin.serve(name="gpu.example.com", registry_dir=dir) as plugin:
    await plugin.publish([Device("gpu-0", {"model": "A100", "memory": Quantity("40Gi")})])
```
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Stream

from nodeagent.plugins.bridge import GrpcBridge
from nodeagent.protos.dra.v1alpha3 import api_grpc, api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.sdk._server import PluginServer, serving

__all__ = ["Device", "DevicePlugin", "Quantity", "SemVer", "build_resources"]


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes quantity such as "40Gi" or "500m"."""

    value: str


@dataclass(frozen=True)
class SemVer:
    """A semantic version attribute such as "1.2.3"."""

    value: str


AttributeValue = bool | int | str | Quantity | SemVer | Sequence[int] | Sequence[str]


@dataclass(frozen=True)
class Device:
    """One named resource instance and its attributes."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


def _attribute_value(value: AttributeValue) -> v1alpha2.NamedResourcesAttributeValue:
    out = v1alpha2.NamedResourcesAttributeValue()
    if isinstance(value, bool):  # before int: bool is an int
        out.bool = value
    elif isinstance(value, int):
        out.int = value
    elif isinstance(value, str):
        out.string = value
    elif isinstance(value, Quantity):
        out.quantity.string = value.value
    elif isinstance(value, SemVer):
        out.version = value.value
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        out.intSlice.ints.extend(int(v) for v in value)
    elif all(isinstance(v, str) for v in value):
        out.stringSlice.strings.extend(str(v) for v in value)
    else:
        raise TypeError(f"unsupported attribute value {value!r}")
    return out


def build_resources(devices: Sequence[Device]) -> api_pb2.NodeListAndWatchResourcesResponse:
    """One ResourceModel with every device as a named-resources instance."""
    instances = [
        v1alpha2.NamedResourcesInstance(
            name=device.name,
            attributes=[
                v1alpha2.NamedResourcesAttribute(name=key, attributeValue=_attribute_value(value))
                for key, value in device.attributes.items()
            ],
        )
        for device in devices
    ]
    model = v1alpha2.ResourceModel(
        namedResources=v1alpha2.NamedResourcesResources(instances=instances)
    )
    return api_pb2.NodeListAndWatchResourcesResponse(resources=[model])


class _NodeService(api_grpc.NodeBase):
    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin

    async def NodePrepareResources(
        self,
        stream: Stream[api_pb2.NodePrepareResourcesRequest, api_pb2.NodePrepareResourcesResponse],
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "this SDK plugin only lists resources")

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            api_pb2.NodeUnprepareResourcesRequest, api_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "this SDK plugin only lists resources")

    async def NodeListAndWatchResources(
        self,
        stream: Stream[
            api_pb2.NodeListAndWatchResourcesRequest, api_pb2.NodeListAndWatchResourcesResponse
        ],
    ) -> None:
        await self._plugin._stream_updates(stream)


class DevicePlugin(PluginServer[api_pb2.NodeListAndWatchResourcesResponse]):
    """A seed DRA plugin: Registration on `<registry_dir>/<name>-reg.sock`, v1alpha3.Node on the
    same socket or (``separate_endpoint=True``) on the hidden `<registry_dir>/.<name>-dra.sock`."""

    plugin_type = "DRAPlugin"

    def services(self) -> list[Any]:
        return [_NodeService(self)]

    async def publish(self, devices: Sequence[Device]) -> None:
        """Replace the plugin's whole device list; every open stream sends it."""
        await self.publish_message(build_resources(devices))

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        *,
        name: str,
        registry_dir: str,
        versions: Sequence[str] = ("1.0.0",),
        separate_endpoint: bool = False,
        bridge: GrpcBridge | None = None,
    ) -> AsyncIterator[DevicePlugin]:
        """Serve until the block exits, then remove the socket(s). Without `bridge`, opens one."""
        path = _socket_path(registry_dir, f"{name}-reg.sock")
        endpoint = _socket_path(registry_dir, f".{name}-dra.sock") if separate_endpoint else ""
        plugin = cls(name, path, endpoint, versions)
        async with serving(plugin, bridge, separate_endpoint=separate_endpoint):
            yield plugin


def _socket_path(registry_dir: str, filename: str) -> str:
    return os.path.join(os.path.abspath(registry_dir), filename)
