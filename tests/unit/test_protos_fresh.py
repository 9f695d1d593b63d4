"""The committed generated protobuf/grpclib code must be exactly what scripts/gen-protos makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "python" / "nodeagent" / "protos"


def _generated_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def test_committed_protos_match_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "protos"
    venv = Path(sys.executable).parent.parent
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen-protos"), str(out)],
        check=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "NODEAGENT_VENV": str(venv)},
        capture_output=True,
    )
    fresh = _generated_files(out)
    committed = _generated_files(COMMITTED)
    assert fresh, "gen-protos produced nothing"
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    stale = sorted(name for name in set(fresh) & set(committed) if fresh[name] != committed[name])
    assert not missing, f"generated files not committed (run scripts/gen-protos): {missing}"
    assert not extra, f"committed files no .proto generates (run scripts/gen-protos): {extra}"
    assert not stale, f"stale generated files (run scripts/gen-protos): {stale}"


def test_generated_modules_import_as_one_package() -> None:
    from nodeagent.protos.dra.v1alpha3 import api_grpc as dra_grpc
    from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
    from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
    from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
    from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep

    channel: Any = object()  # stubs only store the channel until a call is made
    paths = [
        dra_grpc.NodeStub(channel).NodeListAndWatchResources.name,
        reg_grpc.RegistrationStub(channel).GetInfo.name,
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus.name,
        rep_grpc.ReporterPluginStub(channel).ListAndWatchReportContent.name,
    ]
    assert paths == [
        "/v1alpha3.Node/NodeListAndWatchResources",
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/reporterplugin.v1alpha1.ReporterPlugin/ListAndWatchReportContent",
    ]
    # Field numbers on the wire: ResourceModel.namedResources = 1 inside resources = 1.
    msg = dra.NodeListAndWatchResourcesResponse(
        resources=[{"namedResources": {"instances": [{"name": "a"}]}}]
    )
    assert msg.SerializeToString() == b"\n\x07\n\x05\n\x03\n\x01a"
    # GroupVersionKind.kind = 3 inside groupVersionKind = 1; proto2 keeps explicit empties.
    content = rep.ReportContent(groupVersionKind={"group": "", "kind": "X"})
    assert content.SerializeToString() == b"\n\x05\n\x00\x1a\x01X"
