"""The ops views of a real agent with a real reporter plugin (the SDK, in its own process, over
its unix socket): what the docs promise, not protobuf's base64."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.process.conftest import StartAgent
from tests.process.test_process_cnr import plugin  # noqa: F401  (a fixture)
from tests.support.wait import until


def test_plugins_view_shows_reporter_values_as_json(
    start_agent: StartAgent,
    registry: str,
    plugin: subprocess.Popen[str],  # noqa: F811
) -> None:
    agent = start_agent("--node-name", "node-a", "--registry-dir", registry)
    agent.wait_ready()

    def zones() -> dict[str, Any] | None:
        doc = json.loads(agent.get("/v1/plugins")[1])
        found = [p for p in doc if p["name"] == "zones" and p.get("last_message")]
        return found[0] if found else None

    entry = until(zones, "the reporter plugin's message on /v1/plugins")
    assert entry["type"] == "ReporterPlugin"
    fields = {
        f["fieldName"]: f for content in entry["last_message"]["content"] for f in content["field"]
    }
    # The plugin sent the JSON '"SingleNUMANodeContainerLevel"' and '1': shown as JSON values
    # (protobuf's JSON mapping made them "IlNpbmdsZU5VTUFOb2RlQ29udGFpbmVyTGV2ZWwi" and "MQ==").
    assert fields["TopologyPolicy"]["value"] == "SingleNUMANodeContainerLevel"
    assert fields["Bogus"]["value"] == 1
    assert "value_base64" not in fields["TopologyPolicy"]
