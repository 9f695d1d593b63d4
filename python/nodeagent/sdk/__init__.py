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

# Each module lists its own public names; the package's are theirs, written once.
from nodeagent.sdk import devices, dra, reporter
from nodeagent.sdk.devices import *  # noqa: F403
from nodeagent.sdk.dra import *  # noqa: F403
from nodeagent.sdk.reporter import *  # noqa: F403

__all__: list[str] = []
__all__ += devices.__all__
__all__ += dra.__all__
__all__ += reporter.__all__
