"""The system reporter on fake /proc and /sys trees (one NUMA node; two sockets with four NUMA
nodes; offline CPUs; no NUMA in the kernel; a memory-only node) and on this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.core.latest import LatestValue
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.reporter.store import ReportStore
from nodeagent.reporter.system import (
    SYSTEM_REPORTER_NAME,
    SystemReporter,
    parse_cpulist,
    read_machine,
)

GIB_KB = 1024 * 1024
FLAGS = "fpu vme sse sse2 avx avx2 avx512f avx512dq hypervisor"


def fake_tree(
    root: Path,
    *,
    online: str,
    sockets: dict[int, int],
    nodes: dict[int, tuple[str, int]] | None,
    memtotal_kb: int,
    flags: str = FLAGS,
    model: str = "Fake CPU @ 2.0GHz",
) -> Path:
    """A /proc + /sys tree: `sockets` maps each online CPU to its package, `nodes` each NUMA
    node to (cpulist, MemTotal kB); None: a kernel without NUMA (no node directory)."""
    (root / "proc").mkdir(parents=True)
    cpuinfo = "".join(
        f"processor\t: {cpu}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n" for cpu in sockets
    )
    (root / "proc/cpuinfo").write_text(cpuinfo)
    (root / "proc/meminfo").write_text(f"MemTotal:       {memtotal_kb} kB\nMemFree:        1 kB\n")
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(online + "\n")
    for cpu, package in sockets.items():
        topology = cpu_dir / f"cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
    if nodes is not None:
        node_dir = root / "sys/devices/system/node"
        node_dir.mkdir(parents=True)
        (node_dir / "online").write_text("0\n")  # not a node: must be ignored
        for node, (cpulist, kb) in nodes.items():
            (node_dir / f"node{node}").mkdir()
            (node_dir / f"node{node}/cpulist").write_text(cpulist + "\n")
            (node_dir / f"node{node}/meminfo").write_text(
                f"Node {node} MemTotal:       {kb} kB\nNode {node} MemFree:  1 kB\n"
            )
    return root


def fields(reporter: SystemReporter) -> dict[str, Any]:
    response = reporter.collect()
    (content,) = response.content
    gvk = content.groupVersionKind
    assert (gvk.group, gvk.version, gvk.kind) == (
        "node.katalyst.kubewharf.io",
        "v1alpha1",
        "CustomNodeResource",
    )
    types = {f.fieldName: f.fieldType for f in content.field}
    assert types == {"NodeResourceProperties": 0, "TopologyZone": 1}  # Spec, Status
    return {f.fieldName: json.loads(f.value) for f in content.field}


def numa(name: str, cpu: str, memory: str) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory}
    return {
        "type": "Numa",
        "name": name,
        "resources": {"allocatable": resources, "capacity": resources},
    }


def test_one_numa_node(tmp_path: Path) -> None:
    root = fake_tree(
        tmp_path,
        online="0-3",
        sockets={0: 0, 1: 0, 2: 0, 3: 0},
        nodes={0: ("0-3", 16 * GIB_KB)},
        memtotal_kb=16 * GIB_KB + 4,
    )
    got = fields(SystemReporter(root))
    assert got["NodeResourceProperties"] == [
        {"propertyName": "numa", "propertyQuantity": "1"},
        {"propertyName": "socket", "propertyQuantity": "1"},
        {"propertyName": "cpu", "propertyQuantity": "4"},
        {"propertyName": "memory", "propertyQuantity": "16777220Ki"},
        {"propertyName": "cis", "propertyValues": ["avx2", "avx512"]},
        {"propertyName": "is_vm", "propertyValues": ["true"]},
    ]
    assert got["TopologyZone"] == [
        {
            "type": "Socket",
            "name": "0",
            "resources": {},
            "children": [numa("0", "4", "16Gi")],
        }
    ]


def test_two_sockets_with_four_numa_nodes(tmp_path: Path) -> None:
    sockets = {cpu: 0 if cpu < 8 else 1 for cpu in range(16)}
    nodes = {0: ("0-3", 8 * GIB_KB), 1: ("4-7", 8 * GIB_KB), 2: ("8-11", 8 * GIB_KB)}
    nodes[3] = ("12-15", 4 * GIB_KB)
    root = fake_tree(tmp_path, online="0-15", sockets=sockets, nodes=nodes, memtotal_kb=28 * GIB_KB)
    got = fields(SystemReporter(root))
    properties = {p["propertyName"]: p for p in got["NodeResourceProperties"]}
    assert properties["numa"]["propertyQuantity"] == "4"
    assert properties["socket"]["propertyQuantity"] == "2"
    assert properties["cpu"]["propertyQuantity"] == "16"
    assert properties["memory"]["propertyQuantity"] == "28Gi"
    assert got["TopologyZone"] == [
        {
            "type": "Socket",
            "name": "0",
            "resources": {},
            "children": [numa("0", "4", "8Gi"), numa("1", "4", "8Gi")],
        },
        {
            "type": "Socket",
            "name": "1",
            "resources": {},
            "children": [numa("2", "4", "8Gi"), numa("3", "4", "4Gi")],
        },
    ]


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    # cpu3 and cpu6 are offline: no topology directory, still in the node's cpulist.
    sockets = {0: 0, 1: 0, 2: 0, 4: 1, 5: 1, 7: 1}
    nodes = {0: ("0-3", 2 * GIB_KB), 1: ("4-7", 2 * GIB_KB)}
    root = fake_tree(
        tmp_path, online="0-2,4-5,7", sockets=sockets, nodes=nodes, memtotal_kb=4 * GIB_KB
    )
    got = fields(SystemReporter(root))
    properties = {p["propertyName"]: p for p in got["NodeResourceProperties"]}
    assert properties["cpu"]["propertyQuantity"] == "6"
    assert [z["children"] for z in got["TopologyZone"]] == [
        [numa("0", "3", "2Gi")],
        [numa("1", "3", "2Gi")],
    ]


def test_a_kernel_without_numa_is_one_node_and_a_memory_only_node_is_top_level(
    tmp_path: Path,
) -> None:
    root = fake_tree(
        tmp_path / "a", online="0-1", sockets={0: 0, 1: 0}, nodes=None, memtotal_kb=GIB_KB
    )
    assert fields(SystemReporter(root))["TopologyZone"] == [
        {"type": "Socket", "name": "0", "resources": {}, "children": [numa("0", "2", "1Gi")]}
    ]
    root = fake_tree(
        tmp_path / "b",
        online="0-1",
        sockets={0: 0, 1: 0},
        nodes={0: ("0-1", GIB_KB), 1: ("", 2 * GIB_KB)},
        memtotal_kb=3 * GIB_KB,
    )
    zones = fields(SystemReporter(root))["TopologyZone"]
    assert zones[1:] == [numa("1", "0", "2Gi")]


def test_cpu_flags_and_model_are_opt_in_and_is_vm_and_cis_follow_the_flags(
    tmp_path: Path,
) -> None:
    root = fake_tree(
        tmp_path,
        online="0",
        sockets={0: 0},
        nodes={0: ("0", GIB_KB)},
        memtotal_kb=GIB_KB,
        flags="fpu sse2 avx",
        model="Bare Metal CPU",
    )
    plain = {p["propertyName"]: p for p in fields(SystemReporter(root))["NodeResourceProperties"]}
    assert set(plain) == {"numa", "socket", "cpu", "memory", "cis", "is_vm"}
    assert plain["cis"] == {"propertyName": "cis"}  # none supported: no values (as Katalyst)
    assert plain["is_vm"]["propertyValues"] == ["false"]
    full = fields(SystemReporter(root, cpu_flags=True, cpu_model=True))
    properties = {p["propertyName"]: p for p in full["NodeResourceProperties"]}
    assert properties["cpu_flags"]["propertyValues"] == ["fpu,sse2,avx"]
    assert properties["cpu_model"]["propertyValues"] == ["Bare Metal CPU"]
    assert [p["propertyName"] for p in full["NodeResourceProperties"]][-1] == "is_vm"


def test_malformed_files_are_errors_naming_the_file(tmp_path: Path) -> None:
    root = fake_tree(
        tmp_path, online="0-1", sockets={0: 0, 1: 0}, nodes={0: ("1-0", GIB_KB)}, memtotal_kb=1
    )
    with pytest.raises(ValueError, match=r"node0/cpulist: not a cpu list"):
        read_machine(root)
    (root / "proc/meminfo").write_text("MemFree: 1 kB\n")
    with pytest.raises(ValueError, match=r"meminfo: no MemTotal line"):
        read_machine(root)


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)), ("\n", ()), ("5", (5,))]
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_this_machine() -> None:
    machine = read_machine(Path("/"))
    # os.cpu_count() is sysconf(_SC_NPROCESSORS_ONLN), the online CPUs (nproc without affinity).
    assert len(machine.cpus) == os.cpu_count()
    assert machine.memory_bytes == _meminfo_total_bytes()
    assert sum(len(n.cpus) for n in machine.numa) == len(machine.cpus)
    assert len(machine.numa) >= 1 and len(machine.sockets) >= 1
    got = fields(SystemReporter(Path("/")))
    properties = {p["propertyName"]: p for p in got["NodeResourceProperties"]}
    assert properties["cpu"]["propertyQuantity"] == str(os.cpu_count())
    zone_cpus = sum(
        int(n["resources"]["capacity"]["cpu"])
        for z in got["TopologyZone"]
        for n in z.get("children", [z])
    )
    assert zone_cpus == os.cpu_count()


async def test_the_store_runs_the_system_reporter_as_an_in_tree_plugin(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    root = fake_tree(
        tmp_path, online="0-1", sockets={0: 0, 1: 0}, nodes={0: ("0-1", GIB_KB)}, memtotal_kb=GIB_KB
    )
    store = ReportStore(
        LatestValue({}), LatestValue(ReporterSettings()), None, in_tree=[SystemReporter(root)]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        report = store.latest.value[SYSTEM_REPORTER_NAME]
        assert report.running
        assert report.response == SystemReporter(root).collect()
        nursery.cancel_scope.cancel()
