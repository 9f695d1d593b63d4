"""Type stubs for the Rust extension `nodeagent._native`."""

import enum
from collections.abc import Callable
from typing import NamedTuple, final

# The extension's exports (PyO3 lists them in its `__all__`); stubtest checks both agree.
__all__ = [
    "Delta",
    "DeltaKind",
    "PMap",
    "PlanDelete",
    "PlanUpdate",
    "PoolPlan",
    "PreparedDesired",
    "PreparedObserved",
    "SliceError",
    "Store",
    "WatchError",
    "WatchFeed",
    "__version__",
    "desired_slices",
    "inventory_errors",
    "inventory_native",
    "inventory_seed",
    "native_message_error",
    "plan_pool",
    "plan_prepared",
    "prepare_desired",
    "prepare_observed",
    "quantity_canonical",
    "quantity_cmp",
    "quantity_parse",
    "seed_device_name",
    "slice_spec_equal",
]

__version__: str

# Type aliases exist only for type checkers (the extension has no such names), so they are
# private: stubtest does not look for private names at runtime.

class WatchError(NamedTuple):
    """An ERROR watch event's Status."""

    code: int
    reason: str
    message: str

class WatchFeed(NamedTuple):
    """What one `Store.feed` took in."""

    resource_version: str | None
    """The newest resourceVersion of the chunk, None if it had none."""
    error: WatchError | None
    """The first ERROR event."""
    events: int
    """Events applied."""
    malformed: list[str]
    """Messages of the malformed events (skipped)."""

class DeltaKind(enum.IntEnum):
    """The kind of a Delta (an int, as the store's deltas were)."""

    ADD = 0
    UPDATE = 1
    DELETE = 2

class Delta(NamedTuple):
    """One coalesced change of `Store.drain`."""

    kind: DeltaKind
    namespace: str
    name: str
    resource_version: str
    raw: bytes | None
    """The object's raw JSON; None for a delete."""

@final
class Store:
    """The watch store of one query: objects keyed by namespace/name, their raw JSON bytes,
    local-write overrides and the coalesced changes since the last drain. Thread-safe; feed,
    list_page and end_list release the GIL."""

    def __init__(self) -> None: ...
    def feed(self, chunk: bytes) -> WatchFeed:
        """Newline-delimited watch events, split anywhere."""
    def end_stream(self) -> None: ...
    def begin_list(self) -> None: ...
    def list_page(self, page: bytes) -> tuple[int, list[str]]:
        """Returns (items stored, malformed-item messages); ValueError for invalid JSON."""
    def end_list(self, resource_version: str) -> int:
        """Deletes what the relist did not show (none if a page was malformed)."""
    def apply_local(self, obj: bytes, deadline: float) -> bool: ...
    def delete_local(self, namespace: str, name: str, deadline: float) -> bool: ...
    def expire(self, now: float) -> int: ...
    def pending(self) -> int: ...
    def drain(self, accept: Callable[[str, str, bytes], bool | None] | None = None) -> list[Delta]:
        """Coalesced changes since the last drain. An object re-created under the same name
        (another uid) gives a delete of the one shown immediately followed by an add."""
    def get(self, namespace: str, name: str) -> bytes | None: ...
    def shown_keys(self) -> list[tuple[str, str]]: ...
    def memory_usage(self) -> int: ...
    def __len__(self) -> int: ...

@final
class PMap:
    """A persistent map ordered by (namespace, name): `updated` returns a new map sharing every
    untouched node with this one. Backs `nodeagent.accumulator.ObjectMap`."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def get(self, namespace: str, name: str) -> object | None: ...
    def contains(self, namespace: str, name: str) -> bool: ...
    def updated(self, changes: list[tuple[str, str, object, object | None]]) -> PMap: ...
    def keys(self) -> list[object]: ...
    def values(self) -> list[object]: ...
    def items(self) -> list[tuple[object, object]]: ...

# --- ResourceSlice planner (rust/src/planner; owned by the resources/ publisher) -------------

class PlanUpdate(NamedTuple):
    """An observed slice to rewrite with a desired spec; the update carries the observed name and
    resourceVersion."""

    observed: int
    """Index into the observed slices."""
    desired: int
    """Index into the desired specs."""
    name: str
    resource_version: str

class PlanDelete(NamedTuple):
    """An observed slice to delete, with UID and resourceVersion preconditions."""

    observed: int
    """Index into the observed slices."""
    name: str
    uid: str
    resource_version: str

class PoolPlan(NamedTuple):
    """The plan for one pool. A tuple, so it can also be unpacked in field order."""

    generation: int
    """The pool generation the written slices carry."""
    unchanged: list[int]
    """Indices of observed slices left as they are."""
    updates: list[PlanUpdate]
    creates: list[int]
    """Indices of desired specs to create."""
    deletes: list[PlanDelete]

def quantity_parse(s: str) -> tuple[int, str]:
    """(value in nanos, "BinarySI" | "DecimalSI" | "DecimalExponent"); ValueError if invalid."""

def quantity_canonical(s: str) -> str:
    """The canonical spelling ("1024Mi" -> "1Gi", "1.5" -> "1500m"); ValueError if invalid."""

def quantity_cmp(a: str, b: str) -> int:
    """-1, 0 or 1 comparing two quantities by value; ValueError if either is invalid."""

def slice_spec_equal(a: bytes, b: bytes) -> bool:
    """Semantic equality of two ResourceSlice spec JSON objects, ignoring `pool`. Releases the
    GIL; ValueError for invalid JSON."""

def plan_pool(desired: list[bytes], observed: list[bytes]) -> PoolPlan:
    """Plans one pool. `desired`: spec JSON objects of one pool in slice order (their
    pool.generation and resourceSliceCount are ignored); `observed`: the pool's ResourceSlice
    objects as the store holds them. Updated and created slices get
    pool {name, generation, resourceSliceCount=len(desired)}. Releases the GIL; ValueError for
    invalid JSON or desired slices of different pools."""

@final
class PreparedDesired:
    """A desired slice spec decoded and canonicalized once; reuse it while the spec is unchanged."""

    @property
    def pool_name(self) -> str: ...

@final
class PreparedObserved:
    """An observed ResourceSlice decoded and canonicalized once; cache it by (uid,
    resourceVersion)."""

    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def resource_version(self) -> str: ...

class SliceError(ValueError):
    """Slices that could not be decoded or canonicalised (`prepare_desired`,
    `prepare_observed`): every bad one of the list, in order."""

    def __init__(self, message: str, errors: list[tuple[int, str]]) -> None: ...
    @property
    def errors(self) -> list[tuple[int, str]]:
        """(index in the list given, message) of each bad slice."""
    @property
    def index(self) -> int:
        """The first bad slice's index; str() is its message."""

def prepare_desired(specs: list[bytes]) -> list[PreparedDesired]:
    """Releases the GIL; SliceError naming every invalid spec."""

def prepare_observed(objects: list[bytes]) -> list[PreparedObserved]:
    """Releases the GIL; SliceError naming every invalid object."""

def plan_prepared(desired: list[PreparedDesired], observed: list[PreparedObserved]) -> PoolPlan:
    """`plan_pool` on prepared slices: only matching and the plan, O(n), GIL released."""

# --- end of ResourceSlice planner ---------------------------------------------------------------

# --- plugin inventories (rust/src/inventory; called by nodeagent.resources.convert and model) ---

# (the inventory's JSON without the pools' devices, per pool its devices as JSON arrays of at
# most 128 devices): msgspec decodes each batch on its own (short GIL holds in a worker thread).
_InventoryJson = tuple[bytes, list[list[bytes]]]

def inventory_native(
    driver: str, message: bytes, max_string: int, node_name: str | None = None
) -> tuple[_InventoryJson, list[str], list[list[bytes]] | None]:
    """(inventory JSON for msgspec, broken v1 rules, desired slices) of a native `Inventory`
    message's wire bytes; `max_string`: the byte limit of string and version attributes. The
    desired slices (as `desired_slices` writes them, on `node_name`) come only for an inventory
    breaking no rule when `node_name` is given (else None), written from the model in hand.
    Releases the GIL; ValueError for bytes that are not such a message."""

def inventory_seed(
    driver: str, pool: str, message: bytes, max_string: int, node_name: str | None = None
) -> tuple[_InventoryJson, list[tuple[str, str | None, str]], list[str], list[list[bytes]] | None]:
    """(inventory JSON, rejected (device, attribute or None for the whole device, rule), broken
    v1 rules, desired slices as `inventory_native` gives them) of a seed
    `NodeListAndWatchResourcesResponse`'s wire bytes as one pool `pool`. Releases the GIL."""

def inventory_errors(inventory: bytes, max_string: int) -> list[str]:
    """The broken v1 rules of `msgspec.json.encode(inventory)`. Releases the GIL."""

def desired_slices(inventory: bytes, node_name: str) -> list[list[bytes]]:
    """Per pool of a validated inventory (`msgspec.json.encode(inventory)`), its desired slice
    specs as JSON (what `msgspec.json.encode(ResourceSliceSpec)` writes), every quantity in
    canonical form; ValueError naming a quantity that does not parse. Releases the GIL."""

def native_message_error(message: bytes) -> str | None:
    """The first shape rule a native `Inventory` message's wire bytes break. Releases the GIL."""

def seed_device_name(name: str) -> str | None:
    """The v1 device name of a seed instance name, or None when it cannot have one."""
