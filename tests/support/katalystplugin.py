"""A Katalyst reporter plugin built on the upstream katalyst-api, for tests.

Standard library only. The Go side lives in ``tests/harness/katalystplugin`` (one binary,
``katalystplugin``, built on ``github.com/kubewharf/katalyst-api``'s ``pkg/plugins/skeleton``
registration wrapper and its generated ``reporterplugin/v1alpha1`` service, used unchanged); it
is built by ``tests/harness/katalystplugin/build.sh`` into a cache directory keyed by the hash of
its sources, so only the first run on a machine pays for the build, and a test that needs it builds
it on demand.

It serves the Registration and ReporterPlugin services on one socket, ``<dir>/<name>.sock``, the
way Katalyst's reporters do. Typical use::

    plugin = KatalystPlugin.start("kat-a", registry_dir, cnr_content([
        field("Status", "TopologyPolicy", "None"),
        field("Metadata", "Labels", {"example.com/a": "1"}),
    ]))
    plugin.update(cnr_content([...]))  # rewrites the file, SIGHUP, waits until it is re-read
    plugin.kill()  # SIGKILL: a crash, the socket file stays behind
    assert plugin.stop() == 0  # or SIGTERM: the skeleton removes the socket, exit status 0

Environment:
    NODEAGENT_KATALYSTPLUGIN_BIN    use this binary instead of building one
"""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from tests.support.gobuild import GoBinary
from tests.support.goprocess import GoProcess, write_json

__all__ = [
    "CNR_GVK",
    "KatalystPlugin",
    "KatalystPluginBuildError",
    "build_katalystplugin",
    "cnr_content",
    "field",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE_DIR = REPO_ROOT / "tests" / "harness" / "katalystplugin"
BUILD_SH = MODULE_DIR / "build.sh"
START_TIMEOUT = 30.0
RELOADED = "SIGHUP: content reloaded"
NOT_RELOADED = "SIGHUP: content not reloaded"
CNR_GVK = {
    "group": "node.katalyst.kubewharf.io",
    "version": "v1alpha1",
    "kind": "CustomNodeResource",
}


class KatalystPluginBuildError(RuntimeError):
    """build.sh failed; the message carries its output."""


_BINARY = GoBinary(BUILD_SH, "NODEAGENT_KATALYSTPLUGIN_BIN", KatalystPluginBuildError)


def build_katalystplugin() -> pathlib.Path:
    """Run tests/harness/katalystplugin/build.sh (a no-op when cached); return the binary path."""
    return _BINARY.path()


# --------------------------------------------------------------------------
# the content file: GetReportContentResponse's JSON, each value inline JSON


def field(field_type: str, name: str, value: Any) -> dict[str, Any]:
    """One ReportField: `field_type` is Spec, Status or Metadata; `value` is sent as its compact
    JSON (``json.dumps(value, separators=(",", ":"))``, key order kept)."""
    return {"fieldType": field_type, "fieldName": name, "value": value}


def cnr_content(fields: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The content file for one ReportContent of the CustomNodeResource kind."""
    return {"content": [{"groupVersionKind": dict(CNR_GVK), "field": list(fields)}]}


# --------------------------------------------------------------------------
# the plugin process


class KatalystPlugin(GoProcess):
    """A running ``katalystplugin`` process; its stderr goes to ``log_path``."""

    label = "katalystplugin"

    def __init__(
        self,
        name: str,
        plugin_dir: pathlib.Path,
        content_path: pathlib.Path,
        log_path: pathlib.Path,
        proc: subprocess.Popen[bytes],
        log_file: TextIO,
    ) -> None:
        self.name = name
        self.plugin_dir = plugin_dir
        self.content_path = content_path
        super().__init__(log_path, proc, log_file)

    @property
    def socket(self) -> pathlib.Path:
        return self.plugin_dir / f"{self.name}.sock"

    @classmethod
    def start(
        cls,
        name: str,
        plugin_dir: str | pathlib.Path,
        content: Mapping[str, Any],
        *,
        workdir: pathlib.Path | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = START_TIMEOUT,
    ) -> KatalystPlugin:
        """Start the plugin and return once its socket serves (the skeleton logs it)."""
        binary = build_katalystplugin()
        plugin_dir = pathlib.Path(plugin_dir)
        workdir = workdir or plugin_dir.parent
        content_path = workdir / f"{name}-content.json"
        write_json(content_path, content)
        log_path = workdir / f"{name}.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - closed by close()
        proc = subprocess.Popen(
            [
                str(binary),
                "--name",
                name,
                "--plugin-dir",
                str(plugin_dir),
                "--content",
                str(content_path),
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        plugin = cls(name, plugin_dir, content_path, log_path, proc, log_file)
        try:
            # The socket file exists from listen(); "successfully started" is logged after the
            # skeleton's own dial check, when it serves.
            plugin._wait(
                lambda: (
                    plugin.socket.is_socket()
                    and f"successfully started to serve {name}" in plugin.log()
                ),
                "the socket to serve",
                timeout,
            )
        except BaseException:
            plugin.close()
            raise
        return plugin

    def update(self, content: Mapping[str, Any], timeout: float = 10.0) -> None:
        """Replace the content: rewrite the file, SIGHUP, and wait until the plugin has re-read
        it (every open stream is then sent the new content)."""
        self._reload(self.content_path, content, RELOADED, "the content reload", timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash: no cleanup, the socket file stays behind."""
        self.close()
