"""The plugins' inventories as the publisher sees them: per driver, the last valid inventory
and whether (and since when) its plugin is gone.

Every plugin message replaces that plugin's whole inventory. An invalid one is reported (log +
metric) and the last valid inventory stays in force; with none since the agent started, the
slices already published for the plugin stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from nodeagent.core.plugindata import PluginData
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.convert import SeedRejection, convert_native_specs, convert_seed_specs
from nodeagent.resources.model import InvalidInventory, Inventory
from nodeagent.resources.observed import PoolKey

if TYPE_CHECKING:
    from google.protobuf.message import Message

log = get_logger(__name__)

__all__ = ["Converted", "DriverState", "InventoryTracker", "deletion_deadline"]


@dataclass
class DriverState:
    inventory: Inventory | None = None
    # The inventory's desired slices (per pool, its spec bytes), written with its conversion;
    # None: `DesiredSlices.build` writes them from the inventory.
    specs: list[list[bytes]] | None = field(default=None, repr=False)
    registered: bool = False
    # When the plugin was last seen going away (None while registered).
    gone_since: float | None = None
    message: Message | None = field(default=None, repr=False)
    last_error: str = ""


@dataclass(frozen=True)
class Converted:
    """One plugin message converted: the inventory, or the error that rejects it."""

    message: Message
    inventory: Inventory | None
    rejected: list[SeedRejection]  # seed attributes and devices left out
    error: InvalidInventory | None
    specs: list[list[bytes]] | None = None  # its desired slices (`DriverState.specs`)


def deletion_deadline(
    state: DriverState | None, started: float, startup_grace: float, disconnect_grace: float
) -> float:
    """When the slices of a driver without a current inventory for a pool may go (`started`:
    when the publisher started): a gone plugin's after ``disconnect_grace``, and nothing
    before ``startup_grace`` has passed since the start (unknown drivers: slices published
    before a restart); a registered plugin's at once (-inf)."""
    if state is None:
        return started + startup_grace
    if state.registered:
        return -float("inf")
    gone = state.gone_since if state.gone_since is not None else started
    return max(gone + disconnect_grace, started + startup_grace)


class InventoryTracker:
    """Feeds on the plugin manager's snapshots (name -> PluginData); `update` returns the
    drivers whose published state may have changed."""

    def __init__(self, node_name: str, report: Callable[[str, str], None] | None = None) -> None:
        self.node_name = node_name
        self.drivers: dict[str, DriverState] = {}
        # (reason, message) of problems a plugin author must see (Events on the Node).
        self._report = report or (lambda reason, message: None)

    def rejected(self) -> list[str]:
        """Drivers whose latest inventory was rejected."""
        return sorted(d for d, s in self.drivers.items() if s.last_error)

    def shown(self, now: float, grace: float) -> dict[str, DriverState]:
        """The drivers whose slices a standalone agent shows: a gone plugin's for `grace`
        seconds after it left, then no more, as a publishing agent would delete them (a
        start-up grace is for slices published before a restart, which standalone has none
        of)."""
        return {
            d: s
            for d, s in self.drivers.items()
            if s.registered or s.gone_since is None or now < s.gone_since + grace
        }

    def kept(
        self, now: float, started: float, startup_grace: float, disconnect_grace: float
    ) -> dict[str, DriverState]:
        """The drivers whose slices a publishing agent keeps: a gone driver's until its
        `deletion_deadline`, then no more."""
        graces = startup_grace, disconnect_grace
        return {
            d: s
            for d, s in self.drivers.items()
            if s.registered or now < deletion_deadline(s, started, *graces)
        }

    def held(self, pools: Iterable[PoolKey]) -> set[PoolKey]:
        """Of `pools`, those of plugins registered with no valid inventory since the start
        (`Deferral.NO_INVENTORY`): what is published is whatever the last agent left."""
        drivers = self.drivers
        return {
            k
            for k in pools
            if (s := drivers.get(k[0])) is not None and s.registered and s.inventory is None
        }

    def unseen(self, plugins: Mapping[str, PluginData]) -> dict[str, Message]:
        """The plugins' messages `update` has not taken in yet."""
        out: dict[str, Message] = {}
        for name, data in plugins.items():
            state = self.drivers.get(name)
            if data.message is not None and (state is None or data.message is not state.message):
                out[name] = data.message
        return out

    def update(
        self,
        plugins: Mapping[str, PluginData],
        now: float,
        converted: Mapping[str, Converted] | None = None,
    ) -> set[str]:
        """Takes in the plugins' snapshot; `converted` holds messages already converted (in
        a worker thread: a large inventory costs tens of milliseconds of CPU)."""
        changed: set[str] = set()
        for name, data in plugins.items():
            state = self.drivers.setdefault(name, DriverState())
            if data.registered != state.registered:
                state.registered = data.registered
                state.gone_since = None if data.registered else now
                changed.add(name)
            if data.message is not state.message:
                state.message = data.message
                done = (converted or {}).get(name)
                if done is None or done.message is not data.message:
                    done = self.convert(name, data.message)
                if self._accept(name, state, done):
                    changed.add(name)
        for name, state in self.drivers.items():
            if name not in plugins and state.registered:
                state.registered = False
                state.gone_since = now
                changed.add(name)
        return changed

    async def take(
        self, plugins: Mapping[str, PluginData], threshold: int
    ) -> tuple[set[str], bool]:
        """`update` with the messages not taken in yet converted first, in a worker thread when
        they add up to `threshold` bytes or more (0: never): converting, validating and
        splitting a large inventory costs tens of milliseconds of CPU, and in a thread the
        event loop (heartbeat, probes) stays responsive. Returns the drivers `update` returns
        and whether a thread was used. The caller is the only writer of the tracker, so the
        thread reads it undisturbed."""
        unseen = self.unseen(plugins)
        threaded = sum(m.ByteSize() for m in unseen.values()) >= threshold > 0
        converted = None
        if threaded:
            converted = await trio.to_thread.run_sync(self._convert_all, unseen)
        return self.update(plugins, trio.current_time(), converted), threaded

    def _convert_all(self, messages: Mapping[str, Message]) -> dict[str, Converted]:
        return {name: self.convert(name, m) for name, m in messages.items()}

    def convert(self, driver: str, message: Message) -> Converted:
        """The message as a validated inventory, or why not. Pure: safe in a worker thread."""
        # Here, not at the top: an idle node with no plugins never loads protobuf.
        from nodeagent.protos.dra.v1alpha3 import api_pb2
        from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

        rejected: list[SeedRejection] = []
        specs = None
        node = self.node_name
        # Converted and validated in one Rust call (GIL released), the rules of
        # model.validate_inventory, with the desired slices of a valid inventory.
        if isinstance(message, device_pb2.Inventory):
            inventory, errors, specs = convert_native_specs(driver, message, node)
        elif isinstance(message, api_pb2.NodeListAndWatchResourcesResponse):
            inventory, rejected, errors, specs = convert_seed_specs(driver, node, message, node)
        else:
            errors = [f"unsupported message type {type(message).__name__}"]
        if errors:
            return Converted(message, None, rejected, InvalidInventory(driver, errors))
        return Converted(message, inventory, rejected, None, specs)

    def _accept(self, driver: str, state: DriverState, done: Converted) -> bool:
        for r in done.rejected:
            whole_device = r.attribute is None
            what = "Device" if whole_device else "Attribute"
            counter = metrics.DEVICES_REJECTED if whole_device else metrics.ATTRIBUTES_REJECTED
            counter.labels(driver).inc()
            self._report(f"Resource{what}NotPublished", f"plugin {driver!r}: {r}")
            log.warning(
                f"plugin {what.lower()} not published",
                driver=driver,
                device=r.device,
                attribute=r.attribute,
                rule=r.rule,
            )
        exc = done.error
        if exc is not None or done.inventory is None:
            metrics.INVENTORIES_REJECTED.labels(driver).inc()
            state.last_error = str(exc)
            self._report("ResourceInventoryRejected", str(exc))
            log.error(
                "plugin inventory rejected; the last valid inventory stays published"
                if state.inventory is not None
                else "plugin inventory rejected; no valid inventory since the agent started: "
                "the slices already published for it stay as they are",
                driver=driver,
                errors=exc.errors if exc is not None else [],
            )
            return False
        state.inventory, state.specs = done.inventory, done.specs
        state.last_error = ""
        return True
