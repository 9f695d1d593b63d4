"""Shape rules of a native `nodeagent.device.v1alpha1.Inventory` message.

These are the checks that make a message unusable as a whole (a value missing from a oneof,
duplicate names, lists over the v1 size limits, unparsable quantities, including those of request
policies and node-allocatable resources); the resource-level rules (qualified names, DNS labels,
semver, taint effects, the request policy's and binding conditions' rules) are the publisher's,
which names the device and the rule in an Event. Either way the plugin's last good inventory
stays published.

In Rust (`nodeagent._native.native_message_error`, rust/src/inventory/rules.rs): the one
implementation; tests/support/dra_reference/inventory_shape.py is its plain-Python reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent import _native
from nodeagent.plugins.handler import InvalidMessage

if TYPE_CHECKING:
    from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

__all__ = ["validate_inventory_message"]


def validate_inventory_message(message: device_pb2.Inventory) -> None:
    """Raise InvalidMessage naming the first broken rule's field path and value."""
    try:
        error = _native.native_message_error(message.SerializeToString())
    except ValueError as exc:
        raise InvalidMessage(f"message not decodable: {exc}") from None
    if error is not None:
        raise InvalidMessage(error)
