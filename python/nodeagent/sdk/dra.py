"""Writing a DRA device plugin in a few lines, on the native API by default.

```python
async with DevicePlugin.serve(name="gpu.example.com", registry_dir=dir) as plugin:
    await plugin.publish([Device("gpu-0", {"model": "A100"}, capacity={"memory": "40Gi"})])
```

The native API (`nodeagent.device.v1alpha1.DevicePlugin/ListAndWatch`) carries what a node-local
driver sets in a Kubernetes 1.37 ResourceSlice: pools, capacity with request policies
(consumable capacity), taints, counters and compatibility groups, binding conditions,
node-allocatable resources, a partition-type attribute and skipped node operations (see
`nodeagent.sdk.devices` for each field's feature gate). ``api="seed"`` serves the Kubernetes
1.30 `v1alpha3.Node` API instead (what a 1.30 kubelet understands; attributes and plain capacity
only, list attributes allowed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import trio
from google.protobuf.message import Message
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Stream

from nodeagent.protos.dra.v1alpha3 import api_grpc, api_pb2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_grpc, device_pb2
from nodeagent.rpc.bridge import GrpcBridge, open_grpc_bridge
from nodeagent.sdk._server import PluginServer, RegistrationServicer, serving, socket_served
from nodeagent.sdk.devices import (
    Device,
    Pool,
    Taint,
    build_inventory,
    build_resources,
)
from nodeagent.sdk.kubelet import (
    DeviceHealth,
    Health,
    KubeletDriver,
    KubeletPlugin,
    kube_client_for,
    kubelet_registration,
    kubelet_services,
    prepare_plugin_dir,
)

__all__ = ["DevicePlugin", "default_pool_name"]

Api = Literal["native", "seed"]
# What a plugin lists to be given the native stream: the service's full name, from the compiled
# proto (the agent derives it the same way, so the two cannot drift).
_NATIVE_SERVICE: str = device_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name
_DEFAULT_VERSIONS: dict[str, tuple[str, ...]] = {
    "native": (_NATIVE_SERVICE,),
    "seed": ("1.0.0",),
}


def default_pool_name() -> str:
    """The node's name as the kubelet defaults it: $NODE_NAME, else the lowercased hostname.
    Node-local pools are named after their node (the agent names the seed API's pool so too)."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


class _NodeService(api_grpc.NodeBase):
    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin

    async def NodePrepareResources(
        self,
        stream: Stream[api_pb2.NodePrepareResourcesRequest, api_pb2.NodePrepareResourcesResponse],
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "this SDK plugin only lists resources")

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            api_pb2.NodeUnprepareResourcesRequest, api_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "this SDK plugin only lists resources")

    async def NodeListAndWatchResources(
        self,
        stream: Stream[
            api_pb2.NodeListAndWatchResourcesRequest, api_pb2.NodeListAndWatchResourcesResponse
        ],
    ) -> None:
        await self._plugin._stream_updates(stream)


class _DevicePluginService(device_grpc.DevicePluginBase):
    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin

    async def ListAndWatch(
        self, stream: Stream[device_pb2.ListAndWatchRequest, device_pb2.Inventory]
    ) -> None:
        await self._plugin._stream_updates(stream)


class DevicePlugin(PluginServer[Message]):
    """A DRA plugin: Registration on `<registry_dir>/<name>-reg.sock`, its device service (native
    or, with ``api="seed"``, v1alpha3.Node) on the same socket, on the hidden
    `<registry_dir>/.<name>-dra.sock` (``separate_endpoint=True``), or on any absolute path
    (``endpoint=``; the upstream layout is `/var/lib/kubelet/plugins/<name>/dra.sock`)."""

    plugin_type = "DRAPlugin"

    def __init__(
        self,
        name: str,
        socket_path: str,
        endpoint: str,
        versions: Sequence[str],
        *,
        api: Api = "native",
        pool: str | None = None,
    ) -> None:
        if api not in _DEFAULT_VERSIONS:
            raise ValueError(f"api: {api!r}: must be 'native' or 'seed'")
        super().__init__(name, socket_path, endpoint, versions)
        self.api: Api = api
        self.pool = pool or default_pool_name()
        # The kubelet side, when the plugin is a whole driver (`serve(kubelet=...)`).
        self.kubelet: KubeletDriver | None = None
        self.kubelet_registration: RegistrationServicer | None = None
        self._pools: tuple[Pool, ...] = ()
        self._tainted: dict[tuple[str, str], Taint] = {}

    def services(self) -> list[Any]:
        if self.api == "native":
            return [_DevicePluginService(self)]
        return [_NodeService(self)]

    async def publish(self, devices: Sequence[Device], *, pool: str | None = None) -> None:
        """Replace the plugin's whole inventory with `devices` in one pool (default: the
        plugin's `pool`; the seed API has one pool, named by the agent); every open stream
        sends it. ValueError if a device uses what the API cannot carry."""
        if self.api == "seed":
            if pool is not None:
                raise ValueError("pool: the seed API has no pools (the agent names its one pool)")
            await self.publish_message(build_resources(devices))
        else:
            await self.publish_pools([Pool(pool or self.pool, devices)])

    async def publish_pools(self, pools: Sequence[Pool]) -> None:
        """Replace the plugin's whole inventory with `pools` (native API only)."""
        if self.api != "native":
            raise ValueError("publish_pools needs the native API; the seed API has no pools")
        self._pools = tuple(pools)
        await self.publish_message(build_inventory(self._with_health_taints(self._pools)))

    async def wait_kubelet_registered(self) -> None:
        """Wait until the kubelet has told this driver it is registered."""
        registration = self.kubelet_registration
        if registration is None:
            raise RuntimeError("not a kubelet driver: serve(kubelet=KubeletPlugin(...))")
        while not (registration.status.value and registration.status.value.plugin_registered):
            await registration.status.wait_newer(registration.status.version)

    async def report_health(
        self,
        device: str,
        health: Health,
        *,
        pool: str | None = None,
        message: str = "",
        taint: bool = False,
        taint_effect: str = "NoSchedule",
    ) -> None:
        """Report a device's health to the kubelet (DRAResourceHealth: it shows in the status
        of pods using the device). With ``taint=True`` an unhealthy device is also tainted in
        the published pool (key ``<driver>/unhealthy``), so the scheduler stops allocating it
        (``taint_effect="NoExecute"`` also evicts its pods); reporting it healthy again lifts
        the taint."""
        pool = pool or self.pool
        if self.kubelet is not None:
            self.kubelet.set_health([DeviceHealth(pool, device, health, message)])
        key = (pool, device)
        before = dict(self._tainted)
        if taint and health is Health.UNHEALTHY:
            self._tainted[key] = Taint(f"{self.name}/unhealthy", "", taint_effect)
        elif health is Health.HEALTHY:
            self._tainted.pop(key, None)
        if self._tainted != before and self._pools:
            await self.publish_pools(self._pools)
        await trio.lowlevel.checkpoint()

    def _with_health_taints(self, pools: Sequence[Pool]) -> list[Pool]:
        if not self._tainted:
            return list(pools)
        return [
            dataclasses.replace(
                p,
                devices=[
                    dataclasses.replace(d, taints=(*d.taints, self._tainted[(p.name, d.name)]))
                    if (p.name, d.name) in self._tainted
                    else d
                    for d in p.devices
                ],
            )
            for p in pools
        ]

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        *,
        name: str,
        registry_dir: str,
        api: Api = "native",
        pool: str | None = None,
        versions: Sequence[str] | None = None,
        separate_endpoint: bool = False,
        endpoint: str | None = None,
        kubelet: KubeletPlugin | None = None,
        bridge: GrpcBridge | None = None,
    ) -> AsyncIterator[DevicePlugin]:
        """Serve until the block exits, then remove the socket(s). Without `bridge`, opens one.

        `versions` defaults to the API's: the native service name, or "1.0.0" for the seed.
        `endpoint`: the service socket's absolute path (its directory is created).
        `kubelet`: also be the kubelet's DRA driver (`nodeagent.sdk.kubelet`): register with
        the kubelet, prepare and unprepare claims, write CDI specs, report health. When the
        agent watches the kubelet's own registry directory, one registration serves both."""
        path = _socket_path(registry_dir, f"{name}-reg.sock")
        if endpoint is not None:
            if not os.path.isabs(endpoint):
                raise ValueError(f"endpoint: {endpoint!r}: must be an absolute path")
            separate_endpoint = True
        elif separate_endpoint:
            endpoint = _socket_path(registry_dir, f".{name}-dra.sock")
        if versions is None:
            versions = _DEFAULT_VERSIONS.get(api, ())
        plugin = cls(name, path, endpoint or "", versions, api=api, pool=pool)
        if kubelet is None:
            async with serving(plugin, bridge, separate_endpoint=separate_endpoint):
                yield plugin
            return
        if api != "native":
            raise ValueError("kubelet: a kubelet driver publishes through the native API")
        async with contextlib.AsyncExitStack() as stack:
            if bridge is None:
                bridge = await stack.enter_async_context(open_grpc_bridge())
            client = await stack.enter_async_context(kube_client_for(kubelet))
            registration_path, driver_endpoint, plugin_dir = prepare_plugin_dir(kubelet, name)
            plugin.kubelet = KubeletDriver(name, kubelet, plugin_dir, client)
            await trio.to_thread.run_sync(plugin.kubelet.load)
            services = kubelet_services(plugin.kubelet)
            extra: list[str] = []
            if os.path.dirname(registration_path) == os.path.dirname(path):
                # The agent watches the kubelet's registry: one socket, both audiences; the
                # kubelet picks v1.DRAPlugin from the list, the agent the native service.
                services += plugin.services()
                extra = list(versions)
            else:
                await stack.enter_async_context(
                    serving(plugin, bridge, separate_endpoint=separate_endpoint)
                )
            registration = kubelet_registration(name, kubelet, extra)
            # The service socket first: the kubelet dials it as soon as it sees the other.
            await stack.enter_async_context(socket_served(bridge, services, driver_endpoint))
            await stack.enter_async_context(
                socket_served(bridge, [registration], registration_path)
            )
            plugin.kubelet_registration = registration
            if extra:
                plugin.registration = registration
            yield plugin


def _socket_path(registry_dir: str, filename: str) -> str:
    return os.path.join(os.path.abspath(registry_dir), filename)
