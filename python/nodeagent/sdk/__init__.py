"""The plugin SDK: write a node plugin for nodeagent (or the kubelet) in a few lines of Trio.

- `DevicePlugin.serve(name=..., registry_dir=...)` then
  `await plugin.publish([Device(...)])`: a seed DRA (v1alpha3) plugin listing its devices.
- `ReporterPlugin.serve(name=..., registry_dir=...)` then
  `await plugin.report([ReportItem(...)])`: a Katalyst reporter plugin.

Each serves the kubelet `pluginregistration.Registration` service plus its own service on a unix
socket in the registry directory, and removes the socket when the `async with` block exits.
"""

from nodeagent.sdk.dra import Device, DevicePlugin, Quantity, SemVer, build_resources
from nodeagent.sdk.reporter import ReporterPlugin, ReportItem, build_report

__all__ = [
    "Device",
    "DevicePlugin",
    "Quantity",
    "ReportItem",
    "ReporterPlugin",
    "SemVer",
    "build_report",
    "build_resources",
]
