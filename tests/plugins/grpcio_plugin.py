"""A node plugin written with grpcio (the reference gRPC stack), for the wire-compatibility test.

Run as ``python grpcio_plugin.py GEN_DIR KIND SOCKET NAME`` where GEN_DIR holds modules that
grpc_tools compiled from the repo's .proto files and KIND is "reporter", "dra" (the seed API) or
"native" (the nodeagent.device.v1alpha1 API). Each line
``value N`` on stdin publishes a new state; EOF stops the plugin and removes its socket. Every
NotifyRegistrationStatus is echoed to stdout as ``notify True|False <error>``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

gen_dir, kind, socket_path, name = sys.argv[1:5]
sys.path.insert(0, gen_dir)

import grpc  # noqa: E402
from dra.v1alpha3 import api_pb2 as dra  # noqa: E402
from dra.v1alpha3 import api_pb2_grpc as dra_grpc  # noqa: E402
from pluginregistration.v1 import api_pb2 as reg  # noqa: E402
from pluginregistration.v1 import api_pb2_grpc as reg_grpc  # noqa: E402
from reporterplugin.v1alpha1 import api_pb2 as rep  # noqa: E402
from reporterplugin.v1alpha1 import api_pb2_grpc as rep_grpc  # noqa: E402

from nodeagent.device.v1alpha1 import device_pb2 as native  # noqa: E402
from nodeagent.device.v1alpha1 import device_pb2_grpc as native_grpc  # noqa: E402

state = {"version": 0, "value": 0}
changed = threading.Condition()
stopping = threading.Event()


def message(value: int) -> Any:
    if kind == "reporter":
        return rep.GetReportContentResponse(
            content=[
                rep.ReportContent(
                    groupVersionKind={
                        "group": "node.katalyst.kubewharf.io",
                        "version": "v1alpha1",
                        "kind": "CustomNodeResource",
                    },
                    field=[
                        rep.ReportField(
                            fieldType=rep.Status,
                            fieldName="value",
                            value=json.dumps(value).encode(),
                        )
                    ],
                )
            ]
        )
    if kind == "native":
        devices = [
            {
                "name": f"dev-{i}",
                "attributes": {"index": {"int": i}},
                "capacity": {"mem": {"value": "1Gi"}},
            }
            for i in range(value)
        ]
        return native.Inventory(pools=[{"name": "grpcio-pool", "devices": devices}])
    instances = [
        {"name": f"dev-{i}", "attributes": [{"name": "index", "attributeValue": {"int": i}}]}
        for i in range(value)
    ]
    return dra.NodeListAndWatchResourcesResponse(
        resources=[{"namedResources": {"instances": instances}}]
    )


def updates(context: grpc.ServicerContext) -> Iterator[Any]:
    seen = 0

    def newer() -> bool:
        return state["version"] > seen or stopping.is_set()

    while context.is_active() and not stopping.is_set():
        with changed:
            changed.wait_for(newer, timeout=0.2)
            if state["version"] <= seen:
                continue
            seen, value = state["version"], state["value"]
        yield message(value)


class Registration(reg_grpc.RegistrationServicer):
    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        if kind == "reporter":
            return reg.PluginInfo(type="ReporterPlugin", name=name, supported_versions=["v1alpha1"])
        versions = ["nodeagent.device.v1alpha1.DevicePlugin"] if kind == "native" else ["1.0.0"]
        return reg.PluginInfo(type="DRAPlugin", name=name, supported_versions=versions)

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        print(f"notify {request.plugin_registered} {request.error}", flush=True)
        return reg.RegistrationStatusResponse()


class Reporter(rep_grpc.ReporterPluginServicer):
    def GetReportContent(self, request: Any, context: grpc.ServicerContext) -> Any:
        return message(state["value"])

    def ListAndWatchReportContent(self, request: Any, context: grpc.ServicerContext) -> Any:
        yield from updates(context)


class Node(dra_grpc.NodeServicer):
    def NodeListAndWatchResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        yield from updates(context)


class DevicePlugin(native_grpc.DevicePluginServicer):
    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Any:
        yield from updates(context)


server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
rep_grpc.add_ReporterPluginServicer_to_server(Reporter(), server)
dra_grpc.add_NodeServicer_to_server(Node(), server)
native_grpc.add_DevicePluginServicer_to_server(DevicePlugin(), server)
server.add_insecure_port(f"unix:{socket_path}")
server.start()
print("serving", flush=True)
for line in sys.stdin:
    verb, _, arg = line.strip().partition(" ")
    if verb == "value":
        with changed:
            state["value"] = int(arg)
            state["version"] += 1
            changed.notify_all()
stopping.set()
with changed:
    changed.notify_all()
os.unlink(socket_path)
server.stop(grace=1).wait()
