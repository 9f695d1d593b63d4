"""Kubernetes value rules, once: names (DNS labels and subdomains, qualified names, label keys
and values), semantic versions and RFC 3339 times. (`resource.Quantity` is the Rust
`nodeagent._native.quantity_*`, one implementation; its plain-Python reference is
tests/support/quantity.py.)

The agent's settings and reporters check names with these; the inventory rules run the same
rules in Rust (rust/src/inventory/names.rs), property-tested against these through the inventory
reference (tests/unit/resources/test_inventory_native_property.py), so one input cannot pass one
check and fail another. The rules follow
`k8s.io/apimachinery/pkg/util/validation` (whole-string matches: a trailing newline is not
allowed, unlike Python's ``$``).
"""

from __future__ import annotations

import re

__all__ = [
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_key",
    "is_label_value",
    "is_qualified_name",
    "is_rfc3339",
    "is_semver",
]

# --- names -------------------------------------------------------------------------------------

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SEMVER = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-((0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(\.(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(\+([0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*))?"
)
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def is_dns_label(s: str) -> bool:
    """RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, <= 63."""
    return len(s) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(s) is not None


def is_dns_subdomain(s: str, limit: int = DNS_SUBDOMAIN_MAX) -> bool:
    """RFC 1123 subdomain: labels joined by '.', at most `limit` characters in all (upstream
    `IsDNS1123Subdomain` with 253; callers with a tighter field limit pass theirs)."""
    return len(s) <= limit and _DNS_SUBDOMAIN.fullmatch(s) is not None


def is_qualified_name(s: str) -> bool:
    """A C identifier (<= 32) or `<DNS subdomain <= 63>/<C identifier <= 32>` (the
    resource.k8s.io attribute and capacity names)."""
    domain, sep, ident = s.rpartition("/")
    if sep and not is_dns_subdomain(domain, 63):
        return False
    return len(ident) <= 32 and _C_IDENTIFIER.fullmatch(ident) is not None


def is_label_key(s: str) -> bool:
    """A label (or taint) key: an optional DNS-subdomain prefix and '/', then a name <= 63."""
    prefix, sep, name = s.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return False
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def is_label_value(s: str) -> bool:
    """A label (or taint) value: empty, or <= 63 alphanumerics, '-', '_', '.' inside."""
    return len(s) <= 63 and _LABEL_VALUE.fullmatch(s) is not None


def is_semver(s: str) -> bool:
    """Semantic Versioning 2.0.0 (no leading "v")."""
    return _SEMVER.fullmatch(s) is not None


def is_rfc3339(s: str) -> bool:
    """An RFC 3339 timestamp as metav1.Time serialises (optional fraction up to nanoseconds)."""
    return _RFC3339.fullmatch(s) is not None
