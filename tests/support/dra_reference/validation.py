"""The v1 DRA rules of an inventory in plain Python: the reference the Rust implementation
(`nodeagent._native.inventory_errors`, called by `nodeagent.resources.model.validate_inventory`)
is property-tested against (tests/unit/resources/test_inventory_native_property.py). This was
the production code until the rules moved to Rust; keep the two in step."""

from __future__ import annotations

from nodeagent.core.k8s import (
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_qualified_name,
    is_semver,
)
from nodeagent.resources import model
from nodeagent.resources.model import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_CONSUMPTIONS,
    MAX_COUNTERS,
    MAX_TAINTS,
    Counter,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    InvalidInventory,
    Inventory,
)
from tests.support.dra_reference.device_fields import device_field_errors, pool_field_errors
from tests.support.go_time import is_rfc3339
from tests.support.quantity import QuantityError, canonicalize

TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _counters(where: str, counters: dict[str, Counter], errors: list[str]) -> None:
    if not counters:
        errors.append(f"{where}: counters are required (at least one)")
    if len(counters) > MAX_COUNTERS:
        errors.append(f"{where}: {len(counters)} counters, at most {MAX_COUNTERS} allowed")
    for name, counter in counters.items():
        if not is_dns_label(name):
            errors.append(f"{where}: counter name {name!r} must be a DNS label")
        _quantity(f"{where}: counter {name!r}", counter.value, errors)


def _quantity(where: str, value: str, errors: list[str]) -> None:
    try:
        canonicalize(value)
    except QuantityError as exc:
        errors.append(f"{where}: {exc}")


# Go's unicode.ToLower where it lowers a non-ASCII character to ASCII (str.lower maps U+0130
# to "i" and a combining dot).
_GO_LOWER = {"\u0130": "i", "\u212a": "k"}


def is_device_qualified_name(name: str) -> bool:
    """An attribute or capacity name as kube-apiserver checks it: a C identifier (<= 32), or a
    domain and one: the domain is a CSI driver name, at most 63 bytes as written, then checked
    lowered as Go lowers it (`GPU.example.com/model` is accepted)."""
    domain, sep, ident = name.rpartition("/")
    if not sep:
        return is_qualified_name(name)
    lowered = "".join(_GO_LOWER.get(c, c.lower() if c.isascii() else c) for c in domain)
    return len(domain.encode()) <= 63 and is_qualified_name(f"{lowered}/{ident}")


def attribute_errors(name: str, attr: DeviceAttribute) -> list[str]:
    """What is wrong with one device attribute on its own (empty when it may be published)."""
    errors: list[str] = []
    if not is_device_qualified_name(name):
        errors.append("name must be a C identifier (<= 32) or domain/identifier")
    values = [v for v in (attr.int_, attr.bool_, attr.string, attr.version) if v is not None]
    if len(values) != 1:
        errors.append("exactly one of int, bool, string, version must be set")
    for text in (attr.string, attr.version):
        if text is not None and len(text.encode()) > model.MAX_ATTRIBUTE_STRING:
            errors.append(
                f"{len(text.encode())} bytes of UTF-8, at most {model.MAX_ATTRIBUTE_STRING} allowed"
            )
    if attr.version is not None and not is_semver(attr.version):
        errors.append(f"version {attr.version!r} is not semantic versioning 2.0.0")
    return errors


def capacity_errors(name: str, cap: DeviceCapacity) -> list[str]:
    """What is wrong with one device capacity on its own (empty when it may be published)."""
    errors: list[str] = []
    if not is_device_qualified_name(name):
        errors.append("name must be a C identifier (<= 32) or domain/identifier")
    try:
        canonicalize(cap.value)
    except QuantityError as exc:
        errors.append(str(exc))
    return errors


def _device(d: Device, counter_sets: dict[str, set[str]], errors: list[str]) -> None:
    at = f"device {d.name!r}"
    if not is_dns_label(d.name):
        errors.append(f"{at}: name must be a DNS label (lowercase alphanumerics and '-', <= 63)")
    n = len(d.attributes) + len(d.capacity)
    if n > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            f"{at}: {n} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES} allowed"
        )
    for name, attr in d.attributes.items():
        here = f"{at}: attribute {name!r}"
        errors.extend(f"{here}: {e}" for e in attribute_errors(name, attr))
    for name, cap in d.capacity.items():
        errors.extend(f"{at}: capacity {name!r}: {e}" for e in capacity_errors(name, cap))
    if len(d.taints) > MAX_TAINTS:
        errors.append(f"{at}: {len(d.taints)} taints, at most {MAX_TAINTS} allowed")
    for i, taint in enumerate(d.taints):
        here = f"{at}: taint {i}"
        if not is_label_key(taint.key):
            errors.append(f"{here}: key {taint.key!r} must be a qualified label key")
        if not is_label_value(taint.value):
            errors.append(f"{here}: value {taint.value!r} must be a label value")
        if taint.effect not in TAINT_EFFECTS:
            errors.append(f"{here}: effect {taint.effect!r} must be one of {TAINT_EFFECTS}")
        if taint.time_added is not None and not is_rfc3339(taint.time_added):
            errors.append(f"{here}: timeAdded {taint.time_added!r} must be RFC 3339")
    if len(d.consumes_counters) > MAX_COUNTER_CONSUMPTIONS:
        errors.append(
            f"{at}: consumesCounters has {len(d.consumes_counters)} entries, "
            f"at most {MAX_COUNTER_CONSUMPTIONS} allowed"
        )
    used: set[str] = set()
    for use in d.consumes_counters:
        here = f"{at}: consumesCounters {use.counter_set!r}"
        if use.counter_set in used:
            errors.append(f"{here}: the counter set is named twice")
        used.add(use.counter_set)
        # Not a server rule (it does not look across slices): a device consuming a counter
        # nobody publishes could never be allocated, which is a plugin bug to report.
        known = counter_sets.get(use.counter_set)
        if known is None:
            errors.append(f"{here}: no such shared counter set in the pool")
        else:
            for name in use.counters:
                if name not in known:
                    errors.append(f"{here}: counter {name!r} is not in the set")
        _counters(here, use.counters, errors)
    errors.extend(f"{at}: {e}" for e in device_field_errors(d))


def validate_inventory(inv: Inventory) -> None:
    """Raises InvalidInventory listing every broken rule."""
    errors = inventory_errors(inv)
    if errors:
        raise InvalidInventory(inv.driver, errors)


def inventory_errors(inv: Inventory) -> list[str]:
    """Every broken rule of the inventory."""
    errors: list[str] = []
    if not is_dns_subdomain(inv.driver, 63):
        errors.append(f"driver {inv.driver!r}: must be a DNS subdomain of at most 63 characters")
    pools: set[str] = set()
    for pool in inv.pools:
        at = f"pool {pool.name!r}"
        parts = pool.name.split("/")
        if len(pool.name) > 253 or not all(is_dns_subdomain(p) for p in parts):
            errors.append(f"{at}: name must be DNS subdomains joined by '/', <= 253 characters")
        if pool.name in pools:
            errors.append(f"{at}: duplicate pool name")
        pools.add(pool.name)
        sets: dict[str, set[str]] = {}
        for cs in pool.shared_counters:
            if not is_dns_label(cs.name):
                errors.append(f"{at}: counter set {cs.name!r}: name must be a DNS label")
            if cs.name in sets:
                errors.append(f"{at}: counter set {cs.name!r}: duplicate name")
            sets[cs.name] = set(cs.counters)
            _counters(f"{at}: counter set {cs.name!r}", cs.counters, errors)
        errors.extend(f"{at}: {e}" for e in pool_field_errors(inv.driver, pool))
        names: set[str] = set()
        for d in pool.devices:
            if d.name in names:
                errors.append(f"device {d.name!r}: duplicate device name in {at}")
            names.add(d.name)
            _device(d, sets, errors)
    return errors
