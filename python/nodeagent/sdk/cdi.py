"""CDI (Container Device Interface) specs: what the container runtime injects for a claim.

A driver tells the kubelet which CDI devices a prepared claim needs; the runtime (containerd,
CRI-O) looks them up in the spec files of its CDI directories (``/var/run/cdi`` by default) and
applies their container edits: environment variables, device nodes, mounts. As the upstream
example driver does, the SDK writes one transient spec per claim, named by the CDI library's rule
(``<vendor>-<class>_<claim UID>.json``), with one CDI device per allocated device named
``<claim UID>-<device>``, so a name is never reused by another claim (runtimes cache specs).

The spec's ``cdiVersion`` is the lowest version that can express it (the CDI library's
``MinimumRequiredVersion`` rules for the edits used here), so the runtimes' CDI libraries of
every supported release read it: 0.3.0 for plain edits, 0.4.0 with a mount type, 0.5.0 with a
device node's ``hostPath`` or a device name starting with a digit (a claim UID usually does).

Files are written atomically (a dot-file in the same directory, fsynced, renamed over): a
runtime reading the directory sees the old spec or the new one, never half of one; CDI libraries
read only ``*.json`` and ``*.yaml`` files, so not the temporary file.

The CDI library parses a spec with a YAML decoder (JSON is YAML): the JSON is written with
``\\uXXXX`` escapes for every non-ASCII character of the Basic Multilingual Plane (YAML refuses
raw C1 controls and U+FFFE/U+FFFF, and folds a raw U+0085 as a line break) and characters above
U+FFFF as UTF-8 (YAML has no surrogate-pair escapes: json.dumps's escape of an emoji fails to
parse).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ContainerEdits", "DeviceNode", "Mount", "cdi_kind_for"]

# tags.cncf.io/container-device-interface/pkg/parser: vendor "foo.com" (letters, digits, and
# '.', '-', '_' inside), class "gpu" (letters, digits, and '-', '_', '.' inside, '.' needs 0.6.0).
# \Z, not $: $ also matches before a trailing newline, which the library refuses.
_VENDOR = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?\Z")
_DEVICE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")
_ENV_NAME = re.compile(r"^[^=\0]+\Z")
# What write_spec escapes after json.dumps(ensure_ascii=False): the BMP beyond ASCII (and DEL);
# surrogates stay raw, so a lone one fails to encode (UnicodeEncodeError, a ValueError).
_ESCAPE = re.compile("[\x7f-\ud7ff\ue000-\uffff]")


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container (`path`), from `host_path` if it differs."""

    path: str
    host_path: str = ""
    permissions: str = ""  # "rwm" or a subset; empty: the runtime's default

    def to_json(self) -> dict[str, Any]:
        node: dict[str, Any] = {"path": self.path}
        if self.host_path:
            node["hostPath"] = self.host_path
        if self.permissions:
            node["permissions"] = self.permissions
        return node


@dataclass(frozen=True)
class Mount:
    """A host path mounted into the container."""

    host_path: str
    container_path: str
    options: Sequence[str] = ("ro", "nosuid", "nodev", "bind")
    type: str = ""  # e.g. "bind"; needs CDI 0.4.0

    def to_json(self) -> dict[str, Any]:
        mount: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            mount["options"] = list(self.options)
        if self.type:
            mount["type"] = self.type
        return mount


@dataclass(frozen=True)
class ContainerEdits:
    """What a prepared device changes in the containers that use it."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: Sequence[DeviceNode] = ()
    mounts: Sequence[Mount] = ()

    def validate(self, where: str) -> None:
        if not (self.env or self.device_nodes or self.mounts):
            raise ValueError(f"{where}: no edits (the CDI library refuses an empty device)")
        for name in self.env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{where}: env {name!r}: a name must be non-empty, without '='")
        for node in self.device_nodes:
            if not os.path.isabs(node.path):
                raise ValueError(f"{where}: device node {node.path!r}: must be an absolute path")
            if node.permissions and not set(node.permissions) <= set("rwm"):
                raise ValueError(f"{where}: device node permissions {node.permissions!r}: rwm")
        for mount in self.mounts:
            if not mount.host_path:
                raise ValueError(f"{where}: mount {mount.container_path!r}: empty host path")
            if not os.path.isabs(mount.container_path):
                raise ValueError(f"{where}: mount {mount.container_path!r}: must be absolute")

    def to_json(self) -> dict[str, Any]:
        edits: dict[str, Any] = {}
        if self.env:
            edits["env"] = [f"{k}={v}" for k, v in self.env.items()]
        if self.device_nodes:
            edits["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        if self.mounts:
            edits["mounts"] = [m.to_json() for m in self.mounts]
        return edits

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContainerEdits:
        env = dict(item.split("=", 1) for item in data.get("env", []))
        nodes = tuple(
            DeviceNode(n["path"], n.get("hostPath", ""), n.get("permissions", ""))
            for n in data.get("deviceNodes", [])
        )
        mounts = tuple(
            Mount(m["hostPath"], m["containerPath"], tuple(m.get("options", ())), m.get("type", ""))
            for m in data.get("mounts", [])
        )
        return cls(env, nodes, mounts)


def cdi_kind_for(driver: str) -> str:
    """The default CDI kind of a driver: ``k8s.<driver>/device`` (as the upstream example
    driver's ``k8s.gpu.example.com/gpu``)."""
    return f"k8s.{driver}/device"


def check_kind(kind: str) -> tuple[str, str]:
    """(vendor, class) of a CDI kind; ValueError naming the rule it breaks."""
    vendor, sep, class_ = kind.partition("/")
    if not sep or not _VENDOR.match(vendor) or not _CLASS.match(class_):
        raise ValueError(
            f"cdi_kind: {kind!r}: must be <vendor>/<class>, e.g. 'k8s.gpu.example.com/gpu' "
            "(letters, digits, '.', '-', '_'; class without '.')"
        )
    return vendor, class_


def spec_file_name(kind: str, claim_uid: str) -> str:
    """The CDI library's GenerateTransientSpecName(vendor, class, uid) + ".json"."""
    vendor, class_ = check_kind(kind)
    return f"{vendor}-{class_}_{claim_uid.replace('/', '_')}.json"


def device_id(kind: str, name: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{kind}={name}"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The CDI library's MinimumRequiredVersion for what `build_spec` writes."""
    edits = [d["containerEdits"] for d in spec["devices"]] + [spec.get("containerEdits", {})]
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]):
        return "0.6.0"
    if any(d["name"][:1].isdigit() for d in spec["devices"]) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def build_spec(kind: str, devices: Mapping[str, ContainerEdits]) -> dict[str, Any]:
    """A CDI spec of `kind` with one device per entry (name -> its edits); at least one, as the
    CDI library refuses a spec without devices."""
    check_kind(kind)
    if not devices:
        raise ValueError(f"CDI spec of {kind}: no devices (the CDI library refuses it)")
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": []}
    for name, edits in devices.items():
        if not _DEVICE.match(name):
            raise ValueError(f"CDI device name {name!r}: letters, digits, '_', '.', ':', '-'")
        edits.validate(f"CDI device {name}")
        spec["devices"].append({"name": name, "containerEdits": edits.to_json()})
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def write_spec(directory: str, file_name: str, spec: Mapping[str, Any]) -> str:
    """Write `spec` to `<directory>/<file_name>` atomically; return the path."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, file_name)
    tmp = os.path.join(directory, f".{file_name}.tmp-{os.getpid()}")
    data = _spec_json(spec)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return path


def _spec_json(spec: Mapping[str, Any]) -> bytes:
    """The file's bytes: JSON that the CDI library's YAML decoder reads back unchanged."""
    text = json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False)
    return _ESCAPE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode() + b"\n"


def remove_spec(directory: str, file_name: str) -> bool:
    """Remove a spec file; False if it was not there."""
    try:
        os.unlink(os.path.join(directory, file_name))
    except FileNotFoundError:
        return False
    _fsync_dir(directory)
    return True


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
