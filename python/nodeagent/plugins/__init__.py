"""Plugin discovery, registration and streams (kubelet plugin-registration protocol).

Public API: `PluginManager`, `PluginSettings`, `open_grpc_bridge` / `GrpcBridge`, the handler
interface `PluginHandler` with the built-in `DraHandler` and `ReporterHandler`, and `PluginData`
(what the per-type latest-value channels carry).

Inside, the manager has the kubelet's shape: `state` (desired/actual state of the world, the
per-socket records and `PluginState`), `watcher` (registry scan), `reconciler`, `executor`
(register/unregister operations with per-socket backoff) and `monitor` (GetInfo probes);
`manager.PluginManager` composes them.
"""

from nodeagent.plugins.bridge import GrpcBridge, RpcError, open_grpc_bridge
from nodeagent.plugins.dra import DraHandler
from nodeagent.plugins.handler import PluginData, PluginEndpoint, PluginHandler
from nodeagent.plugins.latest import LatestValue
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.reporter import ReporterHandler
from nodeagent.plugins.settings import PluginSettings

__all__ = [
    "DraHandler",
    "GrpcBridge",
    "LatestValue",
    "PluginData",
    "PluginEndpoint",
    "PluginHandler",
    "PluginManager",
    "PluginSettings",
    "ReporterHandler",
    "RpcError",
    "open_grpc_bridge",
]
