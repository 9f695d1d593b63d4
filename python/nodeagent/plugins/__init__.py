"""Plugin discovery, registration and streams (kubelet plugin-registration protocol).

Public API: `PluginManager`, `PluginSettings`, the handler interface `PluginHandler` with the
built-in `DraHandler` and `ReporterHandler`, and `PluginData` (what the per-type latest-value
channels, `nodeagent.core.latest.LatestValue`, carry). The manager talks gRPC through the
bridge it is given (`nodeagent.rpc.open_grpc_bridge`).

Inside, the manager has the kubelet's shape: `state` (desired/actual state of the world, the
per-socket records and `PluginState`), `watcher` (registry scan), `reconciler`, `executor`
(register/unregister operations with per-socket backoff) and `monitor` (GetInfo probes);
`manager.PluginManager` composes them.
"""

from nodeagent.core.plugindata import PluginData
from nodeagent.plugins.dra import DraHandler
from nodeagent.plugins.handler import PluginEndpoint, PluginHandler
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.reporter_plugin import ReporterHandler
from nodeagent.plugins.settings import PluginSettings

__all__ = [
    "DraHandler",
    "PluginData",
    "PluginEndpoint",
    "PluginHandler",
    "PluginManager",
    "PluginSettings",
    "ReporterHandler",
]
