"""A seed message whose strings are not UTF-8 (proto2 strings are bytes on the wire and the
Python protobuf runtime hands them over as they came) is rejected as an inventory, with the
reason, instead of stopping the publisher: bad input is reported and the last good inventory
stays."""

from __future__ import annotations

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.resources.inventory import InventoryTracker


def _seed_with_bad_name() -> api_pb2.NodeListAndWatchResourcesResponse:
    instance = v1alpha2.NamedResourcesInstance.FromString(b"\n\x02\xff\xfe")
    named = v1alpha2.NamedResourcesResources(instances=[instance])
    return api_pb2.NodeListAndWatchResourcesResponse(
        resources=[v1alpha2.ResourceModel(namedResources=named)]
    )


def test_a_seed_message_with_non_utf8_strings_is_rejected_with_the_reason() -> None:
    done = InventoryTracker("node-a").convert("drv.example.com", _seed_with_bad_name())
    assert done.inventory is None
    assert done.error is not None
    assert done.error.errors == ["message not decodable: invalid UTF-8 in a string field"]
