"""The seed DRA plugin type: v1alpha3.Node NodeListAndWatchResources (Kubernetes 1.30)."""

from __future__ import annotations

import re
from contextlib import AbstractAsyncContextManager

from nodeagent.plugins.bridge import GrpcChannel, ServerStream
from nodeagent.plugins.handler import (
    InvalidMessage,
    PluginEndpoint,
    PluginValidationError,
    StreamingHandler,
)
from nodeagent.plugins.versions import highest_supported_version
from nodeagent.protos.dra.v1alpha3 import api_grpc, api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2

__all__ = ["DRA_PLUGIN_TYPE", "DraHandler", "validate_resources"]

DRA_PLUGIN_TYPE = "DRAPlugin"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# resource.Quantity's string form: sign, number, then an optional binary/decimal suffix or exponent.
_QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
)


class DraHandler(StreamingHandler[api_pb2.NodeListAndWatchResourcesResponse]):
    plugin_type = DRA_PLUGIN_TYPE

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        highest = highest_supported_version(plugin.versions)
        entry = self._entries.get(plugin.name)
        if entry is not None and entry.registered and entry.plugin.socket != plugin.socket:
            # The seed kubelet: a second plugin of the same name needs a strictly higher version.
            current = highest_supported_version(entry.plugin.versions)
            if highest <= current:
                raise PluginValidationError(
                    f"plugin {plugin.name!r} is already registered from {entry.plugin.socket} "
                    f"with version {'.'.join(map(str, current))}; a new plugin of the same name "
                    "needs a strictly higher version"
                )

    def open_stream(
        self, channel: GrpcChannel
    ) -> AbstractAsyncContextManager[ServerStream[api_pb2.NodeListAndWatchResourcesResponse]]:
        stub = channel.stub(api_grpc.NodeStub)
        return self._bridge.server_stream(
            stub.NodeListAndWatchResources, api_pb2.NodeListAndWatchResourcesRequest()
        )

    def validate_message(self, message: api_pb2.NodeListAndWatchResourcesResponse) -> None:
        validate_resources(message)


def validate_resources(message: api_pb2.NodeListAndWatchResourcesResponse) -> None:
    """The rules a ResourceModel list must follow before it may be published."""
    instance_names: set[str] = set()
    for i, model in enumerate(message.resources):
        where = f"resources[{i}]"
        if not model.HasField("namedResources"):
            raise InvalidMessage(f"{where}: exactly one model must be set (namedResources)")
        for j, instance in enumerate(model.namedResources.instances):
            here = f"{where}.namedResources.instances[{j}]"
            if not _DNS_SUBDOMAIN.match(instance.name) or len(instance.name) > 253:
                raise InvalidMessage(f"{here}.name: {instance.name!r}: must be a DNS subdomain")
            if instance.name in instance_names:
                raise InvalidMessage(f"{here}.name: {instance.name!r}: duplicate instance name")
            instance_names.add(instance.name)
            attribute_names: set[str] = set()
            for k, attribute in enumerate(instance.attributes):
                at = f"{here}.attributes[{k}]"
                if not attribute.name:
                    raise InvalidMessage(f"{at}.name: must not be empty")
                if attribute.name in attribute_names:
                    raise InvalidMessage(f"{at}.name: {attribute.name!r}: duplicate attribute")
                attribute_names.add(attribute.name)
                _validate_value(at, attribute.attributeValue)


def _validate_value(at: str, value: v1alpha2.NamedResourcesAttributeValue) -> None:
    fields = value.ListFields()
    if len(fields) != 1:
        raise InvalidMessage(
            f"{at}.attributeValue: exactly one value must be set, got {len(fields)}"
        )
    if value.HasField("quantity") and not _QUANTITY.match(value.quantity.string):
        raise InvalidMessage(
            f"{at}.attributeValue.quantity: {value.quantity.string!r}: not a valid quantity"
        )
