"""An out-of-tree reporter plugin registering as `system-reporter-plugin` (the in-tree system
reporter's name, Katalyst's too) is refused with a clear error over the registration protocol:
it would share one report-store (and checkpoint) entry with the in-tree reporter (issue 21 s5)."""

from __future__ import annotations

import os

from nodeagent.plugins import PluginManager
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.reporter.system import SYSTEM_REPORTER_NAME
from nodeagent.rpc import GrpcBridge
from tests.plugins.support import ScriptedRegistration


async def test_the_in_tree_reporters_name_is_refused(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    impostor = ScriptedRegistration(
        reg.PluginInfo(
            type="ReporterPlugin", name=SYSTEM_REPORTER_NAME, supported_versions=["v1alpha1"]
        )
    )
    async with bridge.serve([impostor], os.path.join(registry, "system.sock")):
        refused = await impostor.wait_notified()
    assert not refused.plugin_registered
    assert f"plugin name {SYSTEM_REPORTER_NAME!r} is reserved" in refused.error
    assert "in-tree system reporter" in refused.error
    assert all(
        item["name"] != SYSTEM_REPORTER_NAME or item["state"] != "registered"
        for item in manager.status()
    )
