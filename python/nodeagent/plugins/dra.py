"""The DRA plugin type, with both plugin-facing APIs.

- Native: `nodeagent.device.v1alpha1.DevicePlugin/ListAndWatch` streams `Inventory` messages,
  chosen when the plugin lists that service name in supported_versions (as the modern kubelet
  negotiates with service names).
- Seed: `v1alpha3.Node/NodeListAndWatchResources` (Kubernetes 1.30) streams
  `NodeListAndWatchResourcesResponse` messages, for plugins advertising semver versions.
- Modern drivers (`v1.DRAPlugin` / `v1beta1.DRAPlugin`, kubelet 1.32+) publish their own
  ResourceSlices: they are registered and shown (api "kubelet-v1"), nothing is streamed.

Both kinds of message go to the same latest-value channel; consumers tell them apart by type.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from nodeagent.plugins.handler import InvalidMessage, PluginEndpoint, PluginValidationError
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.plugins.streaming import StreamingHandler
from nodeagent.plugins.versions import dra_api, highest_supported_version

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from nodeagent.protos.dra.v1alpha3 import api_pb2
    from nodeagent.rpc.bridge import GrpcChannel, ServerStream

__all__ = ["DRA_PLUGIN_TYPE", "DraHandler", "validate_resources"]

DRA_PLUGIN_TYPE = "DRAPlugin"


class DraHandler(StreamingHandler["Message"]):
    plugin_type = DRA_PLUGIN_TYPE

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        if dra_api(plugin.versions) != "seed":
            return  # a newer registration of the same name serves instead (modern kubelet)
        highest = highest_supported_version(plugin.versions)
        entry = self._entries.get(plugin.name)
        if (
            entry is not None
            and entry.registered
            and entry.plugin.socket != plugin.socket
            and dra_api(entry.plugin.versions) == "seed"
        ):
            # The seed kubelet: a second plugin of the same name needs a strictly higher version.
            current = highest_supported_version(entry.plugin.versions)
            if highest <= current:
                raise PluginValidationError(
                    f"plugin {plugin.name!r} is already registered from {entry.plugin.socket} "
                    f"with version {'.'.join(map(str, current))}; a new plugin of the same name "
                    "needs a strictly higher version"
                )

    def streams(self, plugin: PluginEndpoint) -> bool:
        # A modern driver publishes its own ResourceSlices: registered and shown, never streamed
        # from, and nothing is published for it (its slices are not ours to touch).
        return dra_api(plugin.versions) != "kubelet-v1"

    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[Message]]:
        # Here, not at the top: an idle node with no plugins never loads protobuf or grpclib.
        from nodeagent.protos.dra.v1alpha3 import api_grpc, api_pb2
        from nodeagent.protos.nodeagent.device.v1alpha1 import device_grpc, device_pb2

        stream: AbstractAsyncContextManager[ServerStream[Any]]
        if dra_api(plugin.versions) == "native":
            native = channel.stub(device_grpc.DevicePluginStub)
            stream = self._bridge.server_stream(
                native.ListAndWatch, device_pb2.ListAndWatchRequest()
            )
        else:
            seed = channel.stub(api_grpc.NodeStub)
            stream = self._bridge.server_stream(
                seed.NodeListAndWatchResources, api_pb2.NodeListAndWatchResourcesRequest()
            )
        return stream

    def validate_message(self, message: Message) -> None:
        from nodeagent.protos.dra.v1alpha3 import api_pb2
        from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

        if isinstance(message, device_pb2.Inventory):
            validate_inventory_message(message)
        elif isinstance(message, api_pb2.NodeListAndWatchResourcesResponse):
            validate_resources(message)
        else:
            raise InvalidMessage(f"unexpected message type {type(message).__name__}")

    def plugin_status(self, name: str, *, message: bool = True) -> dict[str, Any] | None:
        status = super().plugin_status(name, message=message)
        entry = self._entries.get(name)
        if status is not None and entry is not None:
            status["api"] = dra_api(entry.plugin.versions)
        return status


def validate_resources(message: api_pb2.NodeListAndWatchResourcesResponse) -> None:
    """The shape a ResourceModel list must have to be read at all.

    Only the structure is checked here: names and attribute values are judged one device or one
    attribute at a time when the message is converted, so one bad entry never hides the rest.
    """
    for i, model in enumerate(message.resources):
        if not model.HasField("namedResources"):
            raise InvalidMessage(f"resources[{i}]: exactly one model must be set (namedResources)")
