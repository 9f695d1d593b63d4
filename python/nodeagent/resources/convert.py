"""Both plugin APIs into the one inventory model, in Rust (`nodeagent._native.inventory_*`,
rust/src/inventory/); the plain-Python reference it is property-tested against is
tests/support/dra_reference/.

- Native (`nodeagent.device.v1alpha1`): one-to-one onto v1 devices; an empty string of an
  optional quantity or name is unset, a false `bindsToNode` / `allowMultipleAllocations` too.
- Seed (`v1alpha3.Node/NodeListAndWatchResources`): named-resource instances become devices of one
  pool named after the node (none when there are no instances); instance names become DNS labels
  (`seed_device_name`); bool/int/string/version attributes become device attributes, quantity
  attributes capacity. What v1 cannot hold (int and string slices, an attribute without exactly
  one value, a name with no v1 form) is dropped on its own and reported: one attribute, or one
  device, never the whole inventory.

`convert` converts and validates (the v1 rules of `model.validate_inventory`) in one call; the
work is pure Rust with the GIL released, and msgspec decodes the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from nodeagent import _native
from nodeagent.resources import model
from nodeagent.resources.model import Device, Inventory

if TYPE_CHECKING:
    # Type hints only: the messages come from plugins, which load their modules.
    from nodeagent.protos.dra.v1alpha3 import api_pb2
    from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

__all__ = [
    "SeedRejection",
    "convert_native",
    "convert_native_specs",
    "convert_seed",
    "convert_seed_specs",
    "from_native",
    "from_seed",
    "seed_device_name",
]


@dataclass(frozen=True, slots=True)
class SeedRejection:
    """Part of a seed message that cannot be published: one attribute (the rest of its device is
    published) or, when `attribute` is None, one whole device (the rest of the inventory is)."""

    device: str
    attribute: str | None
    rule: str

    def __str__(self) -> str:
        if self.attribute is None:
            return f"device {self.device!r}: {self.rule}"
        return f"device {self.device!r}: attribute {self.attribute!r}: {self.rule}"


_decode = msgspec.json.Decoder(Inventory).decode
_decode_devices = msgspec.json.Decoder(list[Device]).decode


def _inventory(head: bytes, pools: list[list[bytes]]) -> Inventory:
    """The inventory from Rust's JSON: its devices come in batches of 128, each decoded on its
    own, so that a worker thread converting a large inventory holds the GIL for well under a
    millisecond at a time (one decode of 1,024 devices would hold it for several)."""
    inventory = _decode(head)
    if not any(pools):
        return inventory
    return msgspec.structs.replace(
        inventory,
        pools=[
            msgspec.structs.replace(
                pool, devices=[d for batch in batches for d in _decode_devices(batch)]
            )
            for pool, batches in zip(inventory.pools, pools, strict=True)
        ],
    )


def _undecodable(exc: ValueError) -> str:
    # Strings that are not UTF-8 (proto2 strings reach Python as the bytes that came): the
    # whole inventory is rejected with the reason, as any broken rule is.
    return f"message not decodable: {exc}"


def convert_native(driver: str, message: device_pb2.Inventory) -> tuple[Inventory, list[str]]:
    """The message as an inventory, and the v1 rules it breaks (empty: it may be published)."""
    inventory, errors, _ = convert_native_specs(driver, message, None)
    return inventory, errors


def convert_native_specs(
    driver: str, message: device_pb2.Inventory, node_name: str | None
) -> tuple[Inventory, list[str], list[list[bytes]] | None]:
    """`convert_native`, with the inventory's desired slices on `node_name` when it breaks no
    rule (`model.desired_specs`), written by the same Rust call from the model it has in hand:
    the inventory is not encoded again for Rust to read back."""
    try:
        (head, pools), errors, specs = _native.inventory_native(
            driver, message.SerializeToString(), model.MAX_ATTRIBUTE_STRING, node_name
        )
    except ValueError as exc:
        return Inventory(driver=driver), [_undecodable(exc)], None
    return _inventory(head, pools), errors, specs


def convert_seed(
    driver: str, pool_name: str, message: api_pb2.NodeListAndWatchResourcesResponse
) -> tuple[Inventory, list[SeedRejection], list[str]]:
    """The seed message as one pool (named after the node, as node-local pools are), what had to
    be left out of it (single attributes, or whole devices whose name has no v1 form), and the
    v1 rules the rest breaks.

    The first instance of a name wins; a later duplicate (or a name mapping onto one already
    used) is rejected on its own. No instances at all means no pool, hence no slices.
    """
    inventory, rejected, errors, _ = convert_seed_specs(driver, pool_name, message, None)
    return inventory, rejected, errors


def convert_seed_specs(
    driver: str,
    pool_name: str,
    message: api_pb2.NodeListAndWatchResourcesResponse,
    node_name: str | None,
) -> tuple[Inventory, list[SeedRejection], list[str], list[list[bytes]] | None]:
    """`convert_seed`, with the desired slices as `convert_native_specs` gives them."""
    try:
        (head, pools), rejected, errors, specs = _native.inventory_seed(
            driver, pool_name, message.SerializeToString(), model.MAX_ATTRIBUTE_STRING, node_name
        )
    except ValueError as exc:
        return Inventory(driver=driver), [], [_undecodable(exc)], None
    return _inventory(head, pools), [SeedRejection(*r) for r in rejected], errors, specs


def from_native(driver: str, message: device_pb2.Inventory) -> Inventory:
    """The message as an inventory, not validated (`model.validate_inventory` does)."""
    return convert_native(driver, message)[0]


def from_seed(
    driver: str, pool_name: str, message: api_pb2.NodeListAndWatchResourcesResponse
) -> tuple[Inventory, list[SeedRejection]]:
    """`convert_seed` without the validation of what is kept."""
    inventory, rejected, _ = convert_seed(driver, pool_name, message)
    return inventory, rejected


def seed_device_name(instance_name: str) -> str | None:
    """The v1 device name of a seed instance name, or None when it cannot have one.

    Seed names are DNS subdomains (`gpu.0`), v1 names DNS labels. A label is kept as it is; any
    other subdomain becomes its dots turned to dashes, cut to 54 characters, then `-` and the first
    8 hex digits of the SHA-256 of the original name. The hash keeps the mapping a pure function of
    the name (stable across restarts, plugins and agents) and keeps `gpu.0` apart from a device
    really named `gpu-0`.
    """
    return _native.seed_device_name(instance_name)
