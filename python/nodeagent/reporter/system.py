"""The in-tree system reporter: the node's resource properties and NUMA topology from /proc and
/sys, reported as Katalyst's `system-reporter-plugin` reports them, plus the topology zones.

Reported (CustomNodeResource of node.katalyst.kubewharf.io/v1alpha1):
- Spec `NodeResourceProperties`, Katalyst's property names and order: `numa` (NUMA nodes),
  `socket` (ours: CPU packages), `cpu` (online logical CPUs, as cadvisor's NumCores), `memory`
  (MemTotal, a binary quantity), `cis` (`avx2`, `avx512`), `cpu_flags` (opt-in: one value, the
  flags joined by commas), `cpu_model` (ours, opt-in: the model name; Katalyst's `cpu_codename`
  comes from a metrics source the agent does not have), `is_vm` (`"true"`/`"false"`). Katalyst's
  `nbw` and `topology` (network interfaces) are not reported; nor are Katalyst's empty `{}` and
  null items (a disabled cpu_flags, an unknown codename), which a strict reader rejects.
- Status `TopologyZone`: one `Socket` zone per CPU package (named by its physical_package_id),
  its children the `Numa` zones (named by node id) whose CPUs it holds, each with capacity and
  allocatable `cpu` (online CPUs of the node) and `memory` (the node's MemTotal); allocatable
  equals capacity (the kubelet's reservations are not known here; Katalyst's kubelet reporter
  takes them from PodResources). A NUMA node with no online CPU (memory only) is a top-level
  Numa zone.

Everything is read below a root path, so tests use fake trees. Offline CPUs are left out.
`cis` follows Katalyst's intent, not its regular expression: Katalyst looks for a flag named
exactly `avx512`, which Linux never prints; here any `avx512f` flag means `avx512`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent._native import quantity_canonical
from nodeagent.reporter.model import GroupVersionKind, PlainReport, ReportContent, ReportField

__all__ = [
    "SYSTEM_REPORTER_NAME",
    "Machine",
    "NumaNode",
    "SystemReporter",
    "parse_cpulist",
    "read_machine",
]

SYSTEM_REPORTER_NAME = "system-reporter-plugin"  # Katalyst's name: its checkpoint entry matches
CNR_GROUP = "node.katalyst.kubewharf.io"
CNR_VERSION = "v1alpha1"
CNR_KIND = "CustomNodeResource"

_NODE_DIR = re.compile(r"node(\d+)")
_MEMTOTAL = re.compile(r"^(?:Node \d+ )?MemTotal:\s+(\d+) kB$", re.MULTILINE)


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]  # online only
    memory_bytes: int


@dataclass(frozen=True)
class Machine:
    """What the system reporter reads from one root."""

    cpus: tuple[int, ...]  # online logical CPUs
    memory_bytes: int
    numa: tuple[NumaNode, ...]
    socket_of: dict[int, int]  # online CPU -> physical package id
    cpu_model: str
    flags: tuple[str, ...]
    is_vm: bool

    @property
    def sockets(self) -> list[int]:
        return sorted(set(self.socket_of.values()))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The kernel's cpulist format ("0-3,8,10-11"; empty: none); ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        low, high = int(first), int(last) if sep else int(first)
        if high < low:
            raise ValueError(f"bad cpu range {part!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def _read_cpulist(path: Path) -> tuple[int, ...]:
    try:
        return parse_cpulist(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a cpu list: {exc}") from None


def _cpuinfo_field(cpuinfo: str, *names: str) -> str:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in names:
            return value.strip()
    return ""


def _memtotal_kb(text: str, where: Path) -> int:
    match = _MEMTOTAL.search(text)
    if match is None:
        raise ValueError(f"{where}: no MemTotal line")
    return int(match[1])


def read_machine(root: Path) -> Machine:
    """Read the machine below `root` ("/" on a node); OSError or ValueError naming the file."""
    proc, cpu_dir = root / "proc", root / "sys/devices/system/cpu"
    cpuinfo = (proc / "cpuinfo").read_text()
    online_file = cpu_dir / "online"
    if online_file.exists():
        cpus = _read_cpulist(online_file)
    else:  # a kernel without CPU hotplug: cpuinfo lists the online CPUs
        count = sum(1 for line in cpuinfo.splitlines() if line.startswith("processor"))
        cpus = tuple(range(count))
    memory_kb = _memtotal_kb((proc / "meminfo").read_text(), proc / "meminfo")
    socket_of = {cpu: _socket(cpu_dir, cpu) for cpu in cpus}
    numa = _numa_nodes(root, cpus, memory_kb)
    flags = tuple(_cpuinfo_field(cpuinfo, "flags", "Features").split())
    hypervisor = root / "sys/hypervisor/type"
    is_vm = "hypervisor" in flags or (hypervisor.exists() and bool(hypervisor.read_text().strip()))
    return Machine(
        cpus=cpus,
        memory_bytes=memory_kb * 1024,
        numa=numa,
        socket_of=socket_of,
        cpu_model=_cpuinfo_field(cpuinfo, "model name", "Model", "cpu model"),
        flags=flags,
        is_vm=is_vm,
    )


def _socket(cpu_dir: Path, cpu: int) -> int:
    path = cpu_dir / f"cpu{cpu}/topology/physical_package_id"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0  # no topology exported (some VMs, old kernels): one package
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{path}: not an integer: {text.strip()!r}") from None
    return max(value, 0)  # -1: the kernel does not know; one package


def _numa_nodes(root: Path, cpus: tuple[int, ...], memory_kb: int) -> tuple[NumaNode, ...]:
    node_dir = root / "sys/devices/system/node"
    ids = (
        sorted(int(m[1]) for p in node_dir.iterdir() if (m := _NODE_DIR.fullmatch(p.name)))
        if node_dir.is_dir()
        else []
    )
    if not ids:  # a kernel without NUMA: one node holding everything
        return (NumaNode(0, cpus, memory_kb * 1024),)
    online = set(cpus)
    nodes = []
    for node in ids:
        base = node_dir / f"node{node}"
        node_cpus = tuple(c for c in _read_cpulist(base / "cpulist") if c in online)
        kb = _memtotal_kb((base / "meminfo").read_text(), base / "meminfo")
        nodes.append(NumaNode(node, node_cpus, kb * 1024))
    return tuple(nodes)


def _quantity(value: int) -> str:
    return quantity_canonical(str(value))


def _memory(value: int) -> str:
    # A binary quantity, as Katalyst's resource.NewQuantity(bytes, BinarySI) prints.
    return quantity_canonical(f"{value // 1024}Ki") if value % 1024 == 0 else _quantity(value)


def node_resource_properties(
    machine: Machine, *, cpu_flags: bool = False, cpu_model: bool = False
) -> list[dict[str, Any]]:
    """The Spec `NodeResourceProperties` items, in Katalyst's order."""
    cis = sorted(
        {"avx2"} & set(machine.flags)
        | ({"avx512"} if any(f.startswith("avx512f") for f in machine.flags) else set())
    )
    items: list[dict[str, Any]] = [
        {"propertyName": "numa", "propertyQuantity": _quantity(len(machine.numa))},
        {"propertyName": "socket", "propertyQuantity": _quantity(len(machine.sockets))},
        {"propertyName": "cpu", "propertyQuantity": _quantity(len(machine.cpus))},
        {"propertyName": "memory", "propertyQuantity": _memory(machine.memory_bytes)},
        {"propertyName": "cis", **({"propertyValues": cis} if cis else {})},
    ]
    if cpu_flags and machine.flags:
        items.append({"propertyName": "cpu_flags", "propertyValues": [",".join(machine.flags)]})
    if cpu_model and machine.cpu_model:
        items.append({"propertyName": "cpu_model", "propertyValues": [machine.cpu_model]})
    items.append({"propertyName": "is_vm", "propertyValues": [str(machine.is_vm).lower()]})
    return items


def topology_zones(machine: Machine) -> list[dict[str, Any]]:
    """The Status `TopologyZone` list: Socket -> Numa zones with cpu and memory resources."""
    by_socket: dict[int, list[dict[str, Any]]] = {s: [] for s in machine.sockets}
    top: list[dict[str, Any]] = []
    for node in machine.numa:
        resources = {"cpu": _quantity(len(node.cpus)), "memory": _memory(node.memory_bytes)}
        zone = {
            "type": "Numa",
            "name": str(node.id),
            "resources": {"allocatable": dict(resources), "capacity": resources},
        }
        if node.cpus:
            by_socket[machine.socket_of[node.cpus[0]]].append(zone)
        else:
            top.append(zone)
    sockets = [
        {"type": "Socket", "name": str(s), "resources": {}, "children": children}
        for s, children in sorted(by_socket.items())
    ]
    return sockets + top


# FieldType values of the ReporterPlugin proto (reporterplugin.v1alpha1.FieldType).
_SPEC, _STATUS = 0, 1


def build_system_report(
    machine: Machine, *, cpu_flags: bool = False, cpu_model: bool = False
) -> PlainReport:
    """The report, as plain values: no protobuf at idle (a node with no plugins never loads it;
    its wire form, checkpointed, is protobuf's byte for byte)."""

    def field(field_type: int, name: str, value: Any) -> ReportField:
        return ReportField(field_type, name, json.dumps(value, separators=(",", ":")).encode())

    properties = node_resource_properties(machine, cpu_flags=cpu_flags, cpu_model=cpu_model)
    content = ReportContent(
        GroupVersionKind(CNR_GROUP, CNR_VERSION, CNR_KIND),
        (
            field(_SPEC, "NodeResourceProperties", properties),
            field(_STATUS, "TopologyZone", topology_zones(machine)),
        ),
    )
    return PlainReport((content,))


class SystemReporter:
    """The in-tree reporter (`InTreeReporter`): reads `root` on every collection."""

    name = SYSTEM_REPORTER_NAME

    def __init__(
        self, root: Path = Path("/"), *, cpu_flags: bool = False, cpu_model: bool = False
    ) -> None:
        self.root = root
        self.cpu_flags = cpu_flags
        self.cpu_model = cpu_model

    def collect(self) -> PlainReport:
        machine = read_machine(self.root)
        return build_system_report(machine, cpu_flags=self.cpu_flags, cpu_model=self.cpu_model)
