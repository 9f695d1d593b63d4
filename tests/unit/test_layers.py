"""The package picture is enforced: imports point down the layers only, and every package's
public surface is exactly its listed `__all__` (in the style of httpx's
tests/test_exported_members.py and trio's export tests).

Every import counts, wherever it is written: module level, inside functions, and under
`TYPE_CHECKING` (a type-only import is still a dependency a reader must follow). A new package,
or a new edge between packages, is a decision: add it to the tables below, downward only.
"""

from __future__ import annotations

import ast
import graphlib
import importlib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import nodeagent

ROOT = Path(nodeagent.__file__).resolve().parent

# The layers, top first: a package may import only packages in lower layers. The leaves import
# no other nodeagent package, except `config` (TOML loading), which raises `core`'s ConfigError.
LAYERS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    # service: the composition root, the one package that imports the components;
    # rollout_controller: the rollout controller's process (`nodeagent rollout-controller`).
    {"service", "rollout_controller"},
    {"resources", "reporter", "dynconfig"},
    {"accumulator", "sdk", "rollout"},
    {"plugins", "kube", "checkpoint"},
    {"config", "rpc", "nodeagent"},
    {"core", "log", "protos", "_native"},
]

# The edges that exist, each a decision. `nodeagent` is the top-level package itself
# (`__version__`).
ALLOWED: dict[str, set[str]] = {
    "__main__": {"cli"},
    "cli": {"nodeagent", "service", "rollout_controller", "config", "core", "log"},
    "service": {
        "nodeagent",
        "resources",
        "reporter",
        "dynconfig",
        "accumulator",
        "checkpoint",
        "plugins",
        "kube",
        "rpc",
        "config",
        "core",
        "log",
    },
    # The controller plans with `rollout` and targets nodes with the agent's own selection
    # (`dynconfig.source`); it watches through the accumulator (issue 31).
    "rollout_controller": {"rollout", "dynconfig", "accumulator", "kube", "core", "log"},
    "resources": {"accumulator", "kube", "core", "log", "protos", "_native"},
    "reporter": {"accumulator", "checkpoint", "core", "kube", "log", "protos", "_native"},
    # `rollout`: an agent decides its admission with the controller's own code (issue 31).
    "dynconfig": {"accumulator", "checkpoint", "core", "kube", "log", "rollout"},
    "accumulator": {"kube", "core", "log", "_native"},
    # The rollout's API, rank order and pure planner: no I/O, nothing below it needed yet.
    "rollout": set(),
    # A DRA driver reads ResourceClaims and checkpoints its prepared claims (sdk/kubelet.py).
    # ... and says where an agent with default settings looks (config's defaults, sdk/running.py).
    "sdk": {"rpc", "kube", "checkpoint", "config", "core", "log", "protos"},
    "plugins": {"rpc", "core", "log", "protos", "_native"},  # DRA message shape rules
    "kube": {"core", "log"},
    "checkpoint": {"core", "log"},
    "config": {"core"},
    "rpc": set(),
    "core": set(),
    "log": set(),
    "protos": set(),
    "_native": set(),
    "nodeagent": {"_native"},  # __version__, built into the extension from Cargo.toml
}

# Each package's public names: exactly these are in its __init__'s `__all__`, and nothing else
# public is defined there. An empty set: the package is imported module by module. `protos` is
# generated (scripts/gen-protos) and imported module by module.
EXPORTS: dict[str, set[str]] = {
    "nodeagent": {"__version__"},
    "accumulator": {
        "RECONNECT_GRACE",
        "Accumulator",
        "AccumulatorClient",
        "AccumulatorSettings",
        "Delta",
        "DeltaType",
        "ObjectKey",
        "ObjectMap",
        "Query",
        "QueryForbiddenError",
        "QueryState",
        "QueryStatus",
        "Watch",
        "WatchHub",
        "client_watch",
    },
    "checkpoint": {"CheckpointRead", "CheckpointState", "CheckpointStore"},
    "config": set(),
    "core": set(),
    "dynconfig": set(),
    "rollout": set(),
    "rollout_controller": set(),
    "kube": {
        "CONFIGMAPS",
        "CORE_EVENTS",
        "CUSTOMRESOURCEDEFINITIONS",
        "EVENTS",
        "LEASES",
        "NAMESPACES",
        "NODES",
        "NODE_EVENTS",
        "RESOURCECLAIMS",
        "RESOURCESLICES",
        "ApiError",
        "BadRequest",
        "ClusterConfig",
        "Conflict",
        "DryRun",
        "EventRecorder",
        "EventSink",
        "FeedResult",
        "Forbidden",
        "GapSink",
        "Invalid",
        "Involved",
        "KubeClient",
        "KubeError",
        "KindLookup",
        "KubeSettings",
        "ListFailureSink",
        "ListPage",
        "ListResult",
        "NotFound",
        "Resource",
        "WatchError",
        "WatchOptions",
        "WatchRequest",
        "WatchSink",
        "WriteEvent",
        "in_cluster_config",
        "load_client",
        "lookup_kind",
        "load_kubeconfig",
        "not_dry_run_view",
        "run_watch",
    },
    "plugins": {
        "DraHandler",
        "PluginData",
        "PluginEndpoint",
        "PluginHandler",
        "PluginManager",
        "PluginSettings",
        "ReporterHandler",
    },
    "reporter": set(),
    "resources": set(),
    "rpc": {
        "ConnectCheck",
        "GrpcBridge",
        "GrpcChannel",
        "MalformedMessage",
        "MessageRejected",
        "MessageTooLarge",
        "RpcError",
        "ServerStream",
        "open_grpc_bridge",
        "run_in_trio",
    },
    "sdk": {
        "AllocatedDevice",
        "Claim",
        "ClaimRef",
        "ContainerEdits",
        "DeviceHealth",
        "DeviceNode",
        "Health",
        "KubeletPlugin",
        "Mount",
        "OpaqueConfig",
        "PreparedDevice",
        "cdi_kind_for",
        "default_registry_dir",
        "stop_signal",
        "Capacity",
        "CounterConsumption",
        "CounterSet",
        "Device",
        "DevicePlugin",
        "NodeAllocatable",
        "Pool",
        "Quantity",
        "ReportItem",
        "ReporterPlugin",
        "RequestPolicy",
        "SemVer",
        "Taint",
        "ValidRange",
        "build_inventory",
        "build_report",
        "build_resources",
        "default_pool_name",
    },
    "service": set(),
}


def _package_of(module: str) -> str | None:
    """`nodeagent.kube.client` -> "kube"; `nodeagent` -> "nodeagent"; other roots -> None."""
    parts = module.split(".")
    if parts[0] != "nodeagent":
        return None
    return parts[1] if len(parts) > 1 else "nodeagent"


def _source_files() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        parts = ["nodeagent", *relative.parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _is_submodule(name: str) -> bool:
    return (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file() or name == "_native"


def _imported(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base != "nodeagent":
                yield node.lineno, base
                continue
            for alias in node.names:  # `from nodeagent import _native, __version__`
                submodule = _is_submodule(alias.name)
                yield node.lineno, f"nodeagent.{alias.name}" if submodule else "nodeagent"


# Packages with a public face: another package enters them through their `__init__` only (its
# `__all__`), as httpx's users import `httpx`, never `httpx._client`; their inner modules are
# theirs to rearrange. Importing one of their modules by name (`from nodeagent.kube import
# errors`) is entering it by a side door too.
FACADES = {"kube", "accumulator", "plugins", "checkpoint", "sdk"}


def _deep_imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a facade package's inner module from outside it."""
    source = _package_of(module)
    for line, target in _imported(module, path):
        parts = target.split(".")
        if len(parts) > 2 and parts[1] in FACADES and parts[1] != source:
            yield line, target
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if len(parts) == 2 and parts[0] == "nodeagent" and parts[1] in FACADES:
                if parts[1] == source:
                    continue
                for alias in node.names:
                    if _is_submodule(f"{parts[1]}/{alias.name}"):
                        yield node.lineno, f"{node.module}.{alias.name}"


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer package, imported package) -> where ("file:line")."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in _source_files():
        source = _package_of(module)
        assert source is not None
        for line, target_module in _imported(module, path):
            target = _package_of(target_module)
            if target is None or target == source:
                continue
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            edges.setdefault((source, target), []).append(where)
    return edges


def _packages_on_disk() -> set[str]:
    names = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    names |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    return names | {"_native", "nodeagent"}


def test_every_package_is_placed_in_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert placed == set(ALLOWED)
    assert _packages_on_disk() == placed


def test_the_allowed_graph_points_down_the_layers_only() -> None:
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = {(a, b) for a, targets in ALLOWED.items() for b in targets if rank[b] <= rank[a]}
    assert upward == set()
    # No cycles, whatever the layers say.
    graphlib.TopologicalSorter(ALLOWED).prepare()


def test_imports_follow_the_allowed_graph() -> None:
    violations = [
        f"{a} -> {b}: {', '.join(where)}"
        for (a, b), where in sorted(_edges().items())
        if b not in ALLOWED[a]
    ]
    assert violations == []


def test_packages_with_a_public_face_are_entered_through_it() -> None:
    deep = [
        f"{path.relative_to(ROOT.parent)}:{line}: {target}"
        for module, path in _source_files()
        for line, target in _deep_imports(module, path)
    ]
    assert deep == []


def test_a_deep_import_is_found(tmp_path: Path) -> None:
    source = (
        "from nodeagent.kube.client import KubeClient\n"
        "from nodeagent.kube import errors, KubeClient as Client\n"
        "def f() -> None:\n"
        "    import nodeagent.plugins.manager\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = {name for _, name in _deep_imports("nodeagent.resources.mod", path)}
    assert found == {"nodeagent.kube.client", "nodeagent.kube.errors", "nodeagent.plugins.manager"}
    assert set(_deep_imports("nodeagent.kube.mod", path)) <= {(4, "nodeagent.plugins.manager")}


def test_every_allowed_edge_is_used() -> None:
    """A stale allowance would let a layer violation in unnoticed: drop it when the code does."""
    used = set(_edges())
    unused = {(a, b) for a, targets in ALLOWED.items() for b in targets if (a, b) not in used}
    assert unused == set()


def test_imports_inside_functions_and_type_checking_count(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from nodeagent.plugins.handler import PluginData\n"
        "def f() -> None:\n"
        "    import nodeagent.kube.client\n"
        "    from nodeagent import _native, core\n"
        "    from . import sibling\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = {name for _, name in _imported("nodeagent.resources.mod", path)}
    assert {
        "nodeagent.plugins.handler",
        "nodeagent.kube.client",
        "nodeagent._native",
        "nodeagent.core",
        "nodeagent.resources",
    } <= found


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_package_exports_exactly_its_listed_names(package: str) -> None:
    module = importlib.import_module(
        "nodeagent" if package == "nodeagent" else f"nodeagent.{package}"
    )
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package}/__init__.py has no __all__"
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    assert set(exported) == EXPORTS[package]
    for name in exported:
        assert hasattr(module, name), f"{package}.__all__ names {name!r}, which does not exist"
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(exported), f"public but not exported: {sorted(public - set(exported))}"


def test_every_package_has_an_export_list() -> None:
    packages = {p for p in _packages_on_disk() if (ROOT / p).is_dir()} - {"protos"}
    assert set(EXPORTS) == packages | {"nodeagent"}


def _module_imports(module: str, path: Path, modules: set[str]) -> Iterator[str]:
    """The nodeagent modules the file imports: `from nodeagent.plugins import metrics` is the
    module `nodeagent.plugins.metrics`, not the package's `__init__`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    yield submodule
                elif base in modules:
                    yield base


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Inside a package too: a circle (even through `TYPE_CHECKING`) means two modules a reader
    can understand only together; one of them holds two nouns."""
    files = dict(_source_files())
    graph = {m: set(_module_imports(m, p, set(files))) - {m} for m, p in files.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")
