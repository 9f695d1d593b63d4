"""supported_versions rules of the built-in plugin types."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from nodeagent.plugins.handler import PluginValidationError

__all__ = [
    "KUBELET_DRA_SERVICES",
    "NATIVE_DRA_SERVICE",
    "DraApi",
    "dra_api",
    "highest_supported_version",
    "parse_generic_version",
    "require_any_version",
]

# The fully-qualified gRPC service name of protos/nodeagent/device/v1alpha1/device.proto, spelt
# out so that an idle node never loads protobuf; tests/unit/test_idle_imports.py holds it equal to
# the compiled proto's.
NATIVE_DRA_SERVICE = "nodeagent.device.v1alpha1.DevicePlugin"

# What modern drivers (kubelet 1.32+) list: the kubelet's DRAPlugin service versions. Such a
# driver publishes its own ResourceSlices; there is nothing to stream from it.
KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")

DraApi = Literal["native", "kubelet-v1", "seed"]

# k8s.io/apimachinery/pkg/util/version ParseGeneric: optional "v", at least major.minor.
_GENERIC = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)+)\s*$")


def parse_generic_version(text: str) -> tuple[int, ...]:
    match = _GENERIC.match(text)
    if match is None:
        raise PluginValidationError(f"could not parse {text!r} as a version")
    return tuple(int(part) for part in match.group(1).split("."))


def highest_supported_version(versions: Sequence[str]) -> tuple[int, ...]:
    """The seed DRA rule: every entry must parse; entries with major > 1 are skipped; the
    highest remaining one must have major 1."""
    if not versions:
        raise PluginValidationError("plugin provided empty supported_versions")
    highest: tuple[int, ...] | None = None
    for text in versions:
        version = parse_generic_version(text)
        if version[0] > 1:
            continue
        if highest is None or version > highest:
            highest = version
    if highest is None or highest[0] != 1:
        raise PluginValidationError(
            f"none of the versions {list(versions)} is supported: need major version 1"
        )
    return highest


def require_any_version(versions: Sequence[str], supported: Sequence[str]) -> str:
    """The Katalyst rule: at least one advertised version is one we support."""
    for version in versions:
        if version in supported:
            return version
    raise PluginValidationError(
        f"none of the versions {list(versions)} is supported (supported: {list(supported)})"
    )


def dra_api(versions: Sequence[str]) -> DraApi:
    """Which DRA API a plugin speaks. As the modern kubelet does with service names, a plugin
    listing the native service gets the native stream; one listing the kubelet's v1 / v1beta1
    DRAPlugin service is a modern, self-publishing driver ("kubelet-v1"); otherwise the seed rule
    must accept its versions (semver with major 1), else PluginValidationError."""
    services = {v.strip() for v in versions}
    if NATIVE_DRA_SERVICE in services:
        return "native"
    if services.intersection(KUBELET_DRA_SERVICES):
        return "kubelet-v1"
    try:
        highest_supported_version(versions)
    except PluginValidationError as exc:
        raise PluginValidationError(
            f"{exc} (or list the native service {NATIVE_DRA_SERVICE!r}, or "
            f"{' / '.join(KUBELET_DRA_SERVICES)} for a driver that publishes its own slices)"
        ) from None
    return "seed"
