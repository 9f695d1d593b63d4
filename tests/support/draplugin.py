"""The seed-era DRA plugin built from the upstream Go helper, for tests.

Standard library only. The Go side lives in ``tests/harness/draplugin`` (one binary, ``draplugin``,
built with ``k8s.io/dynamic-resource-allocation/kubeletplugin`` v0.30 unchanged); it is built by
``tests/harness/draplugin/build.sh`` into a cache directory keyed by the hash of its sources, so
only the first run on a machine pays for the build, and a test that needs it builds it on demand.

It registers the way real 1.30 drivers did: ``<registry>/<driver>-reg.sock`` for registration,
``<plugins>/<driver>/dra.sock`` for the v1alpha3 ``Node`` service, a directory of its own outside
the registry. Typical use::

    dirs = kubelet_dirs()  # /tmp/na-dra-XXXX/{plugins_registry,plugins}
    plugin = DraPlugin.start("gpu.example.com", dirs, [named_resources(instance("gpu.0", ...))])
    plugin.update([...])  # rewrites the inventory file, SIGHUP, waits until it is re-read
    assert plugin.stop() == 0  # SIGTERM: both sockets are removed, exit status 0

Environment:
    NODEAGENT_DRAPLUGIN_BIN    use this binary instead of building one
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from tests.support.gobuild import GoBinary
from tests.support.goprocess import GoProcess, write_json

__all__ = [
    "DraPlugin",
    "DraPluginBuildError",
    "KubeletDirs",
    "build_draplugin",
    "instance",
    "kubelet_dirs",
    "named_resources",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "tests" / "harness" / "draplugin" / "build.sh"
START_TIMEOUT = 30.0
RELOADED = "SIGHUP: inventory reloaded"


class DraPluginBuildError(RuntimeError):
    """build.sh failed; the message carries its output."""


_BINARY = GoBinary(BUILD_SH, "NODEAGENT_DRAPLUGIN_BIN", DraPluginBuildError)


def build_draplugin() -> pathlib.Path:
    """Run tests/harness/draplugin/build.sh (a no-op when cached); return the binary path."""
    return _BINARY.path()


# --------------------------------------------------------------------------
# inventories (resource.k8s.io/v1alpha2 ResourceModel, as JSON)


def instance(
    name: str, attributes: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """One named-resources instance; `attributes` maps a name to its value in the v1alpha2 JSON
    form, e.g. ``{"index": {"int": 0}, "memory": {"quantity": "40Gi"},
    "numa": {"intSlice": {"ints": [0, 1]}}}``."""
    return {
        "name": name,
        "attributes": [{"name": key, **value} for key, value in (attributes or {}).items()],
    }


def named_resources(*instances: Mapping[str, Any]) -> dict[str, Any]:
    """One ResourceModel of the named-resources kind."""
    return {"namedResources": {"instances": list(instances)}}


# --------------------------------------------------------------------------
# the plugin process


@dataclass(frozen=True)
class KubeletDirs:
    """A kubelet-like tree under `root`: the registry directory and the plugins directory (by
    default ``root/plugins_registry`` and ``root/plugins``; both exist)."""

    root: pathlib.Path
    registry: pathlib.Path
    plugins: pathlib.Path

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def kubelet_dirs(prefix: str = "na-dra-", *, plugins_in_registry: bool = False) -> KubeletDirs:
    """A fresh tree under /tmp: unix socket paths are limited to 107 bytes, which pytest's
    tmp_path can exceed. `plugins_in_registry` makes the plugins directory the registry itself,
    so the service socket lands inside the watched tree (``<registry>/<driver>/dra.sock``)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    registry = root / "plugins_registry"
    plugins = registry if plugins_in_registry else root / "plugins"
    registry.mkdir()
    plugins.mkdir(exist_ok=True)
    return KubeletDirs(root, registry, plugins)


class DraPlugin(GoProcess):
    """A running ``draplugin`` process; its stderr goes to ``log_path``."""

    label = "draplugin"

    def __init__(
        self,
        driver: str,
        dirs: KubeletDirs,
        inventory_path: pathlib.Path,
        log_path: pathlib.Path,
        proc: subprocess.Popen[bytes],
        log_file: TextIO,
    ) -> None:
        self.driver = driver
        self.dirs = dirs
        self.inventory_path = inventory_path
        super().__init__(log_path, proc, log_file)

    @property
    def registration_socket(self) -> pathlib.Path:
        return self.dirs.registry / f"{self.driver}-reg.sock"

    @property
    def endpoint(self) -> pathlib.Path:
        return self.dirs.plugins / self.driver / "dra.sock"

    @classmethod
    def start(
        cls,
        driver: str,
        dirs: KubeletDirs,
        resources: Sequence[Mapping[str, Any]],
        *,
        workdir: pathlib.Path | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = START_TIMEOUT,
    ) -> DraPlugin:
        """Start the plugin and return once both of its sockets exist."""
        binary = build_draplugin()
        workdir = workdir or dirs.root
        inventory_path = workdir / f"{driver}-inventory.json"
        write_json(inventory_path, resources)
        log_path = workdir / f"{driver}.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - closed by close()
        proc = subprocess.Popen(
            [
                str(binary),
                "--driver",
                driver,
                "--registry-dir",
                str(dirs.registry),
                "--plugins-dir",
                str(dirs.plugins),
                "--inventory",
                str(inventory_path),
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        plugin = cls(driver, dirs, inventory_path, log_path, proc, log_file)
        try:
            plugin._wait(
                lambda: plugin.registration_socket.is_socket() and plugin.endpoint.is_socket(),
                "both sockets",
                timeout,
            )
        except BaseException:
            plugin.close()
            raise
        return plugin

    def update(self, resources: Sequence[Mapping[str, Any]], timeout: float = 10.0) -> None:
        """Replace the inventory: rewrite the file, SIGHUP, and wait until the plugin has re-read
        it (every open stream is then sent the new inventory)."""
        self._reload(self.inventory_path, resources, RELOADED, "the inventory reload", timeout)
