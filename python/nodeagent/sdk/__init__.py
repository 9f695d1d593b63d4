"""The plugin SDK: write a node plugin for nodeagent (or the kubelet) in a few lines of Trio.

- `DevicePlugin.serve(name=..., registry_dir=...)` then
  `await plugin.publish([Device(...)])` (or `publish_pools([Pool(...)])`): a DRA plugin listing
  its devices on the native `nodeagent.device.v1alpha1` API; ``api="seed"`` serves the seed
  (v1alpha3) API instead.
- `DevicePlugin.serve(..., kubelet=KubeletPlugin(prepare=...))`: a whole DRA driver: it also
  registers with the kubelet, prepares and unprepares claims (CDI specs, a checkpoint) and
  reports device health (`nodeagent.sdk.kubelet`).
- `ReporterPlugin.serve(name=..., registry_dir=...)` then
  `await plugin.report([ReportItem(...)])`: a Katalyst reporter plugin.

`default_registry_dir()` is where an agent with default settings looks; `await stop_signal()`
waits for SIGTERM or SIGINT, after which leaving the `serve` blocks removes the sockets.

Each serves the kubelet `pluginregistration.Registration` service plus its own service on a unix
socket in the registry directory, and removes the socket when the `async with` block exits.
"""

# Each module lists its own public names; the package's are theirs, written once.
from nodeagent.sdk import cdi, claims, devices, dra, kubelet, reports, running
from nodeagent.sdk.cdi import *  # noqa: F403
from nodeagent.sdk.claims import *  # noqa: F403
from nodeagent.sdk.devices import *  # noqa: F403
from nodeagent.sdk.dra import *  # noqa: F403
from nodeagent.sdk.kubelet import *  # noqa: F403
from nodeagent.sdk.reports import *  # noqa: F403
from nodeagent.sdk.running import *  # noqa: F403

__all__: list[str] = []
__all__ += cdi.__all__
__all__ += claims.__all__
__all__ += devices.__all__
__all__ += dra.__all__
__all__ += kubelet.__all__
__all__ += reports.__all__
__all__ += running.__all__
