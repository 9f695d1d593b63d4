"""The modern, self-publishing DRA driver built from the current upstream Go helper, for tests.

Standard library only. The Go side lives in ``tests/harness/draplugin-v037`` (one binary,
``draplugin-v037``, built with ``k8s.io/dynamic-resource-allocation/kubeletplugin`` v0.37.2
unchanged); it is built by ``tests/harness/draplugin-v037/build.sh`` into a cache directory keyed by
the hash of its sources, so only the first run on a machine pays for the build.

It registers as drivers on that helper do: ``<registry>/<driver>-reg.sock`` listing the services
``v1.DRAPlugin``, ``v1beta1.DRAPlugin``, ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``,
the DRA services on ``<plugins>/<driver>/dra.sock``, and it writes its own ResourceSlices (one
pool) with the kubeconfig it is given. Every NotifyRegistrationStatus it is sent is logged, and it
exits 1 when not told "registered" within its registration timeout (30 s), as real drivers do.
Typical use::

    dirs = kubelet_dirs()
    driver = ModernDraPlugin.start("gpu.example.com", dirs, kubeconfig, "node-a",
                                   [device("gpu-0", {"model": {"string": "X"}})])
    assert driver.wait_notified().registered
    driver.update([...])  # rewrites the devices file, SIGHUP, waits until republished
    assert driver.stop() == 0  # SIGTERM: both sockets removed, its slices left as they are

Environment:
    NODEAGENT_DRAPLUGIN_V037_BIN    use this binary instead of building one
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from tests.support.draplugin import KubeletDirs
from tests.support.gobuild import GoBinary
from tests.support.goprocess import STOP_TIMEOUT, GoProcess, write_json

__all__ = [
    "SERVICES",
    "DraPluginV037BuildError",
    "ModernDraPlugin",
    "Notification",
    "build_draplugin_v037",
    "device",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "tests" / "harness" / "draplugin-v037" / "build.sh"
START_TIMEOUT = 30.0
REPUBLISHED = "SIGHUP: devices republished"

# What the v0.37 helper lists in supported_versions by default (draplugin.go, Start).
SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)

_NOTIFIED = re.compile(r'^NotifyRegistrationStatus: registered=(true|false) error=(".*")$', re.M)
_RECORDED = re.compile(r'^RegistrationStatus: registered=(true|false) error=(".*")$', re.M)


class DraPluginV037BuildError(RuntimeError):
    """build.sh failed; the message carries its output."""


_BINARY = GoBinary(BUILD_SH, "NODEAGENT_DRAPLUGIN_V037_BIN", DraPluginV037BuildError)


def build_draplugin_v037() -> pathlib.Path:
    """Run tests/harness/draplugin-v037/build.sh (a no-op when cached); return the binary path."""
    return _BINARY.path()


def device(
    name: str,
    attributes: Mapping[str, Mapping[str, Any]] | None = None,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One resource.k8s.io/v1 Device in its JSON form: `attributes` maps a name to its value,
    e.g. ``{"model": {"string": "A100"}, "index": {"int": 0}}``; `capacity` a name to a
    quantity."""
    out: dict[str, Any] = {"name": name}
    if attributes:
        out["attributes"] = {k: dict(v) for k, v in attributes.items()}
    if capacity:
        out["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return out


@dataclass(frozen=True)
class Notification:
    """One NotifyRegistrationStatus the driver was sent (or the helper's recorded status)."""

    registered: bool
    error: str


def _parse(pattern: re.Pattern[str], text: str) -> list[Notification]:
    return [Notification(r == "true", json.loads(e)) for r, e in pattern.findall(text)]


class ModernDraPlugin(GoProcess):
    """A running ``draplugin-v037`` process; its stderr goes to ``log_path``."""

    label = "draplugin-v037"

    def __init__(
        self,
        driver: str,
        dirs: KubeletDirs,
        devices_path: pathlib.Path,
        log_path: pathlib.Path,
        proc: subprocess.Popen[bytes],
        log_file: TextIO,
        rolling_update_uid: str = "",
    ) -> None:
        self.driver = driver
        self.rolling_update_uid = rolling_update_uid
        self.dirs = dirs
        self.devices_path = devices_path
        super().__init__(log_path, proc, log_file)

    @property
    def registration_socket(self) -> pathlib.Path:
        # With rolling updates, the helper's first choice (it fits: the test paths are short).
        uid = f"-{self.rolling_update_uid}" if self.rolling_update_uid else ""
        return self.dirs.registry / f"{self.driver}{uid}-reg.sock"

    @property
    def endpoint(self) -> pathlib.Path:
        uid = f"-{self.rolling_update_uid}" if self.rolling_update_uid else ""
        return self.dirs.plugins / self.driver / f"dra{uid}.sock"

    @classmethod
    def start(
        cls,
        driver: str,
        dirs: KubeletDirs,
        kubeconfig: pathlib.Path,
        node: str,
        devices: Sequence[Mapping[str, Any]],
        *,
        pool: str | None = None,
        rolling_update_uid: str = "",
        workdir: pathlib.Path | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = START_TIMEOUT,
    ) -> ModernDraPlugin:
        """Start the driver and return once both of its sockets exist. `rolling_update_uid`
        turns on the helper's rolling updates (the pod UID: sockets of their own per instance,
        one plugin data directory)."""
        binary = build_draplugin_v037()
        workdir = workdir or dirs.root
        instance = f"{driver}{'-' + rolling_update_uid if rolling_update_uid else ''}"
        devices_path = workdir / f"{instance}-devices.json"
        write_json(devices_path, devices)
        log_path = workdir / f"{instance}.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - closed by close()
        proc = subprocess.Popen(
            [
                str(binary),
                "--driver",
                driver,
                "--kubeconfig",
                str(kubeconfig),
                "--node-name",
                node,
                "--registry-dir",
                str(dirs.registry),
                "--plugin-data-dir",
                str(dirs.plugins / driver),
                "--devices",
                str(devices_path),
                *(["--pool", pool] if pool is not None else []),
                *(["--rolling-update-uid", rolling_update_uid] if rolling_update_uid else []),
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        plugin = cls(driver, dirs, devices_path, log_path, proc, log_file, rolling_update_uid)
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

    def notifications(self) -> list[Notification]:
        """Every NotifyRegistrationStatus the driver was sent, oldest first."""
        return _parse(_NOTIFIED, self.log())

    def recorded(self) -> list[Notification]:
        """The helper's RegistrationStatus() each time it changed, oldest first (what a driver's
        liveness check reads)."""
        return _parse(_RECORDED, self.log())

    def wait_notified(self, count: int = 1, timeout: float = START_TIMEOUT) -> Notification:
        """The `count`-th NotifyRegistrationStatus the driver was sent."""
        self._wait(lambda: len(self.notifications()) >= count, f"notification {count}", timeout)
        return self.notifications()[count - 1]

    def update(self, devices: Sequence[Mapping[str, Any]], timeout: float = 10.0) -> None:
        """Replace the devices: rewrite the file, SIGHUP, and wait until they are handed to the
        helper's ResourceSlice controller (which writes them soon after)."""
        self._reload(self.devices_path, devices, REPUBLISHED, "the republish", timeout)

    def kill(self) -> int:
        """SIGKILL, as a crash or an OOM kill: nothing is cleaned up, both socket files stay."""
        self.proc.kill()
        try:
            return self.proc.wait(STOP_TIMEOUT)
        finally:
            self.close()
