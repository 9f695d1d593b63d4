"""The plugin SDK: write a node plugin for nodeagent (or the kubelet) in a few lines of Trio.

- `DevicePlugin.serve(name=..., registry_dir=...)` then
  `await plugin.publish([Device(...)])` (or `publish_pools([Pool(...)])`): a DRA plugin listing
  its devices on the native `nodeagent.device.v1alpha1` API; ``api="seed"`` serves the seed
  (v1alpha3) API instead.
- `ReporterPlugin.serve(name=..., registry_dir=...)` then
  `await plugin.report([ReportItem(...)])`: a Katalyst reporter plugin.

Each serves the kubelet `pluginregistration.Registration` service plus its own service on a unix
socket in the registry directory, and removes the socket when the `async with` block exits.
"""

from nodeagent.sdk.devices import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    NodeAllocatable,
    Pool,
    Quantity,
    RequestPolicy,
    SemVer,
    Taint,
    ValidRange,
    build_inventory,
    build_resources,
)
from nodeagent.sdk.dra import DevicePlugin, default_pool_name
from nodeagent.sdk.reporter import ReporterPlugin, ReportItem, build_report

__all__ = [
    "Capacity",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DevicePlugin",
    "NodeAllocatable",
    "Pool",
    "Quantity",
    "ReportItem",
    "ReporterPlugin",
    "RequestPolicy",
    "SemVer",
    "Taint",
    "ValidRange",
    "build_inventory",
    "build_report",
    "build_resources",
    "default_pool_name",
]
