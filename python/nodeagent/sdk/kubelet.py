"""The kubelet side of a DRA driver: registration with the kubelet, prepare and unprepare, health.

A `DevicePlugin` given ``kubelet=KubeletPlugin(prepare=...)`` is a whole DRA driver, laid out as
drivers on the upstream Go helper (`k8s.io/dynamic-resource-allocation/kubeletplugin`) are:

- it registers with the kubelet on ``<kubelet_dir>/plugins_registry/<driver>-reg.sock``
  (type ``DRAPlugin``, versions ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` and, with health on,
  ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``), endpoint
  ``<kubelet_dir>/plugins/<driver>/dra.sock``;
- on that endpoint it serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and its v1beta1 twin
  (`NodePrepareResources`, `NodeUnprepareResources`) and `DRAResourceHealth` (v1, v1alpha1);
- a prepare reads each ResourceClaim from the API server (UID checked, allocation required),
  calls the author's ``prepare`` with this driver's devices and opaque configuration, writes one
  CDI spec per claim into ``cdi_dir`` and records the claim in a checkpoint
  (``<plugin_dir>/checkpoints/prepared-claims``) before answering;
- a prepare of a claim already prepared is answered from the checkpoint (also after a restart:
  no API read, no callback); an unprepare calls ``unprepare``, removes the spec, forgets the
  claim; an unprepare of an unknown claim succeeds (the kubelet retries both after restarts);
- errors are per claim, in the response (the kubelet retries just those); calls are serialised
  (as the Go helper does by default), so a callback never runs twice at once.

The device inventory still goes to nodeagent, which publishes the ResourceSlices.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import trio
from grpclib.server import Stream

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.core.latest import LatestValue
from nodeagent.kube import RESOURCECLAIMS, KubeClient, KubeError, KubeSettings, load_client
from nodeagent.log import get_logger
from nodeagent.protos.dra.v1 import api_grpc as v1_grpc
from nodeagent.protos.dra.v1 import api_pb2 as v1
from nodeagent.protos.dra.v1beta1 import api_grpc as v1beta1_grpc
from nodeagent.protos.dra.v1beta1 import api_pb2 as v1beta1
from nodeagent.protos.dra_health.v1 import api_grpc as health_v1_grpc
from nodeagent.protos.dra_health.v1 import api_pb2 as health_v1
from nodeagent.protos.dra_health.v1alpha1 import api_grpc as health_v1alpha1_grpc
from nodeagent.protos.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import run_in_trio
from nodeagent.sdk._server import RegistrationServicer, remove_stale_socket
from nodeagent.sdk.cdi import (
    ContainerEdits,
    build_spec,
    cdi_kind_for,
    check_kind,
    device_id,
    remove_spec,
    spec_file_name,
    write_spec,
)
from nodeagent.sdk.claims import AllocatedDevice, Claim, ClaimError, ClaimRef, parse_claim

__all__ = [
    "DeviceHealth",
    "Health",
    "KubeletPlugin",
    "PreparedDevice",
]

log = get_logger("nodeagent.sdk.kubelet")

KUBELET_DIR = "/var/lib/kubelet"
CDI_DIR = "/var/run/cdi"
CHECKPOINT = "prepared-claims"
DEFAULT_HEALTH_TIMEOUT = 30  # the kubelet's (pkg/kubelet/cm/dra/healthinfo.go)
# The service names the kubelet matches in supported_versions (not the full gRPC names).
_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device as prepared: the edits its containers get (through CDI)."""

    device: AllocatedDevice
    edits: ContainerEdits = field(default_factory=ContainerEdits)


PrepareCallback = Callable[[Claim], Awaitable[Sequence[PreparedDevice]]]
UnprepareCallback = Callable[[ClaimRef, Sequence[PreparedDevice]], Awaitable[None]]


@dataclass(frozen=True)
class KubeletPlugin:
    """The kubelet side of a driver: the callbacks and where things live.

    ``prepare(claim)`` returns one `PreparedDevice` per device of ``claim.devices`` that needs
    edits (a device it leaves out is handed to the kubelet without CDI devices); raising fails
    that claim only, with the exception's text. ``unprepare(ref, devices)`` gets what prepare
    returned (read back from the checkpoint after a restart). Paths default to the upstream
    layout; ``kubeconfig`` None reads ``$KUBECONFIG``, else the pod's ServiceAccount."""

    prepare: PrepareCallback
    unprepare: UnprepareCallback | None = None
    kubelet_dir: str = KUBELET_DIR
    registry_dir: str | None = None  # default <kubelet_dir>/plugins_registry
    plugin_dir: str | None = None  # default <kubelet_dir>/plugins/<driver>
    cdi_dir: str = CDI_DIR
    cdi_kind: str | None = None  # default k8s.<driver>/device
    kubeconfig: str | None = None
    kube_client: KubeClient | None = None  # an entered client to use instead
    health: bool = True  # serve DRAResourceHealth (the kubelet's ResourceHealthStatus gate)
    # How long the kubelet trusts a reported status before it shows the device as Unknown
    # (health_check_timeout_seconds; 0: the kubelet's default, 30 s). The author reports each
    # device at least this often; the SDK re-sends the list every third of it in between.
    health_timeout: int = 0

    def paths(self, driver: str) -> tuple[str, str, str]:
        """(registration socket, endpoint socket, plugin directory) of `driver`."""
        registry = self.registry_dir or os.path.join(self.kubelet_dir, "plugins_registry")
        plugin_dir = self.plugin_dir or os.path.join(self.kubelet_dir, "plugins", driver)
        return (
            os.path.join(os.path.abspath(registry), f"{driver}-reg.sock"),
            os.path.join(os.path.abspath(plugin_dir), "dra.sock"),
            os.path.abspath(plugin_dir),
        )

    def supported_versions(self) -> list[str]:
        return [*_DRA_SERVICES, *(_HEALTH_SERVICES if self.health else ())]


class Health(Enum):
    """A device's health as the kubelet's DRAResourceHealth API says it."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: Health
    message: str = ""
    updated: float = field(default_factory=time.time)  # Unix seconds


@dataclass
class _Prepared:
    """A prepared claim as the checkpoint keeps it."""

    namespace: str
    name: str
    spec_file: str
    devices: list[tuple[PreparedDevice, list[str]]]  # each device and its CDI device IDs

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "specFile": self.spec_file,
            "devices": [
                {
                    "request": p.device.request,
                    "pool": p.device.pool,
                    "device": p.device.device,
                    "shareID": p.device.share_id,
                    "cdiDeviceIDs": ids,
                    "edits": p.edits.to_json(),
                }
                for p, ids in self.devices
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Prepared:
        devices = [
            (
                PreparedDevice(
                    AllocatedDevice(d["request"], d["pool"], d["device"], share_id=d["shareID"]),
                    ContainerEdits.from_json(d["edits"]),
                ),
                list(d["cdiDeviceIDs"]),
            )
            for d in data["devices"]
        ]
        return cls(data["namespace"], data["name"], data["specFile"], devices)


@dataclass(frozen=True)
class ClaimOutcome:
    """One claim's answer: its devices (request names, pool, device, CDI IDs, share ID)."""

    devices: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...], str | None], ...] = ()
    error: str = ""


class KubeletDriver:
    """The prepare/unprepare state of one driver: callbacks, CDI specs, the checkpoint."""

    def __init__(
        self, driver: str, options: KubeletPlugin, plugin_dir: str, client: KubeClient | None
    ) -> None:
        self.driver = driver
        self.options = options
        self.kind = options.cdi_kind or cdi_kind_for(driver)
        check_kind(self.kind)
        self.client = client
        self._store = CheckpointStore(Path(plugin_dir) / "checkpoints")
        self._lock = trio.Lock()
        self.prepared: dict[str, _Prepared] = {}
        self.health: LatestValue[tuple[DeviceHealth, ...]] = LatestValue(())

    def load(self) -> None:
        """Read the checkpoint of prepared claims (a corrupt one is moved aside: fresh)."""
        read = self._store.read(CHECKPOINT)
        if read.state is not CheckpointState.FOUND:
            return
        try:
            data = json.loads(read.data or b"")
            self.prepared = {uid: _Prepared.from_json(c) for uid, c in data["claims"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.error("prepared-claims checkpoint unreadable: starting empty", error=str(exc))
            self.prepared = {}

    async def _save(self) -> None:
        data = json.dumps(
            {"claims": {uid: c.to_json() for uid, c in self.prepared.items()}}, sort_keys=True
        ).encode()
        await trio.to_thread.run_sync(self._store.write, CHECKPOINT, data)

    # -- prepare ------------------------------------------------------------------------

    async def prepare_claims(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        # The slow API reads first, outside the lock (as the Go helper does).
        claims: dict[str, Claim | str] = {}
        for ref in refs:
            if ref.uid not in self.prepared:
                claims[ref.uid] = await self._read(ref)
        async with self._lock:
            out: dict[str, ClaimOutcome] = {}
            for ref in refs:
                out[ref.uid] = await self._prepare_one(ref, claims.get(ref.uid))
            return out

    async def _read(self, ref: ClaimRef) -> Claim | str:
        if self.client is None:
            return (
                f"claim {ref.namespace}/{ref.name}: no connection to the API server "
                "(give the driver a kubeconfig, or run it in a pod with a ServiceAccount)"
            )
        try:
            data = await self.client.get(RESOURCECLAIMS, ref.name, ref.namespace)
            return parse_claim(data, self.driver, ref)
        except ClaimError as exc:
            return str(exc)
        except KubeError as exc:
            return f"claim {ref.namespace}/{ref.name}: {exc}"

    async def _prepare_one(self, ref: ClaimRef, claim: Claim | str | None) -> ClaimOutcome:
        known = self.prepared.get(ref.uid)
        if known is not None:
            # Idempotent: what was prepared before (maybe by an earlier process). The spec is
            # written again if it went missing (a cleaned /var/run after a reboot).
            spec = trio.Path(self.options.cdi_dir, known.spec_file)
            if known.spec_file and not await spec.exists():
                await trio.to_thread.run_sync(self._write_spec, ref.uid, known.devices)
            return _outcome(known)
        if claim is None:  # prepared and then unprepared while this call waited: read again
            claim = await self._read(ref)
        if isinstance(claim, str):
            return ClaimOutcome(error=claim)
        try:
            results = list(await self.options.prepare(claim))
            devices = self._with_cdi_ids(claim, results)
            spec_file = await trio.to_thread.run_sync(self._write_spec, ref.uid, devices)
        except Exception as exc:  # the author's error: this claim fails, the call goes on
            log.warning("prepare failed", claim=f"{ref.namespace}/{ref.name}", error=str(exc))
            return ClaimOutcome(error=f"prepare {ref.namespace}/{ref.name}: {exc}")
        # Devices of the claim that prepare left out are handed over without CDI devices.
        listed = {(p.device.request, p.device.pool, p.device.device) for p, _ in devices}
        for device in claim.devices:
            if (device.request, device.pool, device.device) not in listed:
                devices.append((PreparedDevice(device), []))
        self.prepared[ref.uid] = _Prepared(ref.namespace, ref.name, spec_file, devices)
        try:
            await self._save()
        except OSError as exc:
            del self.prepared[ref.uid]
            return ClaimOutcome(error=f"prepare {ref.namespace}/{ref.name}: checkpoint: {exc}")
        return _outcome(self.prepared[ref.uid])

    def _with_cdi_ids(
        self, claim: Claim, results: Sequence[PreparedDevice]
    ) -> list[tuple[PreparedDevice, list[str]]]:
        allocated = {(d.request, d.pool, d.device) for d in claim.devices}
        out: list[tuple[PreparedDevice, list[str]]] = []
        for result in results:
            key = (result.device.request, result.device.pool, result.device.device)
            if key not in allocated:
                raise ValueError(
                    f"device {result.device.pool}/{result.device.device} (request "
                    f"{result.device.request}) is not allocated to this claim by {self.driver}"
                )
            edits = result.edits.to_json()
            ids = [device_id(self.kind, _cdi_name(claim.uid, result.device))] if edits else []
            out.append((result, ids))
        return out

    def _write_spec(self, uid: str, devices: Sequence[tuple[PreparedDevice, list[str]]]) -> str:
        file_name = spec_file_name(self.kind, uid)
        entries = {_cdi_name(uid, p.device): p.edits for p, ids in devices if ids}
        if entries:
            write_spec(self.options.cdi_dir, file_name, build_spec(self.kind, entries))
        return file_name

    # -- unprepare ----------------------------------------------------------------------

    async def unprepare_claims(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        async with self._lock:
            out: dict[str, ClaimOutcome] = {}
            for ref in refs:
                out[ref.uid] = await self._unprepare_one(ref)
            return out

    async def _unprepare_one(self, ref: ClaimRef) -> ClaimOutcome:
        known = self.prepared.get(ref.uid)
        spec_file = spec_file_name(self.kind, ref.uid)
        if known is None:
            # Unknown: nothing to undo (a repeat, or a prepare that never finished); a spec a
            # crash left behind goes all the same.
            await trio.to_thread.run_sync(remove_spec, self.options.cdi_dir, spec_file)
            return ClaimOutcome()
        try:
            if self.options.unprepare is not None:
                await self.options.unprepare(ref, [p for p, _ in known.devices])
            await trio.to_thread.run_sync(remove_spec, self.options.cdi_dir, known.spec_file)
        except Exception as exc:  # kept prepared: the kubelet asks again
            log.warning("unprepare failed", claim=f"{ref.namespace}/{ref.name}", error=str(exc))
            return ClaimOutcome(error=f"unprepare {ref.namespace}/{ref.name}: {exc}")
        del self.prepared[ref.uid]
        try:
            await self._save()
        except OSError as exc:
            self.prepared[ref.uid] = known
            return ClaimOutcome(error=f"unprepare {ref.namespace}/{ref.name}: checkpoint: {exc}")
        return ClaimOutcome()

    # -- health -------------------------------------------------------------------------

    def set_health(self, statuses: Sequence[DeviceHealth]) -> None:
        """Merge `statuses` into the reported health (keyed by pool and device)."""
        merged = {(h.pool, h.device): h for h in self.health.value}
        merged.update({(h.pool, h.device): h for h in statuses})
        self.health.set(tuple(merged.values()))

    async def next_health(
        self, version: int, sent: frozenset[tuple[str, str, Health, str]]
    ) -> tuple[int, tuple[DeviceHealth, ...]]:
        """The health list to send next: once a status differs from `sent`, or, at the latest,
        a third of the kubelet's timeout after the last send (with the reports' fresh times,
        so a device still reported is never shown as Unknown)."""
        resend = (self.options.health_timeout or DEFAULT_HEALTH_TIMEOUT) / 3
        with trio.move_on_after(resend):
            while True:
                version, statuses = await self.health.wait_newer(version)
                if _health_key(statuses) != sent:
                    return version, statuses
        return self.health.version, self.health.value


def _health_key(statuses: Sequence[DeviceHealth]) -> frozenset[tuple[str, str, Health, str]]:
    return frozenset((h.pool, h.device, h.health, h.message) for h in statuses)


def _cdi_name(claim_uid: str, device: AllocatedDevice) -> str:
    # One CDI device per allocated device; a shared device's allocations differ by share ID.
    suffix = f"-{device.share_id}" if device.share_id else ""
    return f"{claim_uid}-{device.device}{suffix}"


def _outcome(prepared: _Prepared) -> ClaimOutcome:
    return ClaimOutcome(
        devices=tuple(
            (
                (p.device.request.split("/", 1)[0],),  # subrequests are reported by their parent
                p.device.pool,
                p.device.device,
                tuple(ids),
                p.device.share_id,
            )
            for p, ids in prepared.devices
        )
    )


# -- the gRPC services (run on the bridge's asyncio loop; the work runs in Trio) -------------


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


async def _prepare(driver: KubeletDriver, stream: Stream[Any, Any], pb: Any) -> None:
    """NodePrepareResources on `pb`'s messages (v1 or v1beta1: the same but for share_id)."""
    request = await stream.recv_message()
    assert request is not None
    outcomes = await run_in_trio(driver.prepare_claims, _refs(request.claims))
    response = pb.NodePrepareResourcesResponse()
    for uid, outcome in outcomes.items():
        entry = response.claims[uid]
        entry.error = outcome.error
        for requests, pool, device, ids, share_id in outcome.devices:
            added = entry.devices.add(
                request_names=requests, pool_name=pool, device_name=device, cdi_device_ids=ids
            )
            if share_id and pb is v1:  # v1beta1 has no share ID
                added.share_id = share_id
    await stream.send_message(response)


async def _unprepare(driver: KubeletDriver, stream: Stream[Any, Any], pb: Any) -> None:
    """NodeUnprepareResources on `pb`'s messages: every claim asked for has an entry."""
    request = await stream.recv_message()
    assert request is not None
    outcomes = await run_in_trio(driver.unprepare_claims, _refs(request.claims))
    response = pb.NodeUnprepareResourcesResponse()
    for uid, outcome in outcomes.items():
        response.claims[uid].error = outcome.error
    await stream.send_message(response)


class _DRAPluginV1(v1_grpc.DRAPluginBase):
    def __init__(self, driver: KubeletDriver) -> None:
        self._driver = driver

    async def NodePrepareResources(
        self, stream: Stream[v1.NodePrepareResourcesRequest, v1.NodePrepareResourcesResponse]
    ) -> None:
        await _prepare(self._driver, stream, v1)

    async def NodeUnprepareResources(
        self, stream: Stream[v1.NodeUnprepareResourcesRequest, v1.NodeUnprepareResourcesResponse]
    ) -> None:
        await _unprepare(self._driver, stream, v1)


class _DRAPluginV1beta1(v1beta1_grpc.DRAPluginBase):
    """The same calls on the v1beta1 messages, for kubelets that pick v1beta1."""

    def __init__(self, driver: KubeletDriver) -> None:
        self._driver = driver

    async def NodePrepareResources(
        self,
        stream: Stream[v1beta1.NodePrepareResourcesRequest, v1beta1.NodePrepareResourcesResponse],
    ) -> None:
        await _prepare(self._driver, stream, v1beta1)

    async def NodeUnprepareResources(
        self,
        stream: Stream[
            v1beta1.NodeUnprepareResourcesRequest, v1beta1.NodeUnprepareResourcesResponse
        ],
    ) -> None:
        await _unprepare(self._driver, stream, v1beta1)


async def _watch_health(driver: KubeletDriver, stream: Stream[Any, Any], pb: Any) -> None:
    """Send the whole health list now, after every change and before the kubelet's timeout,
    until the kubelet leaves."""
    await stream.recv_message()
    version, statuses = driver.health.version, driver.health.value
    while True:
        response = pb.NodeWatchResourcesResponse()
        for h in statuses:
            response.devices.add(
                device=pb.DeviceIdentifier(pool_name=h.pool, device_name=h.device),
                health=h.health.value,
                last_updated_time=int(h.updated),
                health_check_timeout_seconds=driver.options.health_timeout,
                message=h.message[:1024],
            )
        await stream.send_message(response)
        version, statuses = await run_in_trio(driver.next_health, version, _health_key(statuses))


class _HealthV1(health_v1_grpc.DRAResourceHealthBase):
    def __init__(self, driver: KubeletDriver) -> None:
        self._driver = driver

    async def NodeWatchResources(
        self,
        stream: Stream[health_v1.NodeWatchResourcesRequest, health_v1.NodeWatchResourcesResponse],
    ) -> None:
        await _watch_health(self._driver, stream, health_v1)


class _HealthV1alpha1(health_v1alpha1_grpc.DRAResourceHealthBase):
    def __init__(self, driver: KubeletDriver) -> None:
        self._driver = driver

    async def NodeWatchResources(
        self,
        stream: Stream[
            health_v1alpha1.NodeWatchResourcesRequest, health_v1alpha1.NodeWatchResourcesResponse
        ],
    ) -> None:
        await _watch_health(self._driver, stream, health_v1alpha1)


def kubelet_services(driver: KubeletDriver) -> list[Any]:
    services: list[Any] = [_DRAPluginV1(driver), _DRAPluginV1beta1(driver)]
    if driver.options.health:
        services += [_HealthV1(driver), _HealthV1alpha1(driver)]
    return services


def kubelet_registration(
    name: str, options: KubeletPlugin, extra: Sequence[str]
) -> RegistrationServicer:
    _, endpoint, _ = options.paths(name)
    return RegistrationServicer(
        reg.PluginInfo(
            type="DRAPlugin",
            name=name,
            endpoint=endpoint,
            supported_versions=[*options.supported_versions(), *extra],
        )
    )


@contextlib.asynccontextmanager
async def kube_client_for(options: KubeletPlugin) -> AsyncIterator[KubeClient | None]:
    """The client a driver reads claims with: the given one, a kubeconfig's, or the pod's."""
    if options.kube_client is not None:
        yield options.kube_client
        return
    kubeconfig = options.kubeconfig or os.environ.get("KUBECONFIG")
    client = load_client(KubeSettings(kubeconfig=kubeconfig))
    if client is None:
        log.warning("no cluster connection: prepares will fail until the driver gets one")
        yield None
        return
    async with client:
        yield client


def prepare_plugin_dir(options: KubeletPlugin, name: str) -> tuple[str, str, str]:
    """Create the plugin and registry directories; remove stale sockets; the three paths."""
    registration, endpoint, plugin_dir = options.paths(name)
    for path in (registration, endpoint):
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        remove_stale_socket(path)
    return registration, endpoint, plugin_dir
