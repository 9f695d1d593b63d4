"""A reporter plugin written with grpcio that only answers the unary GetReportContent (its
ListAndWatchReportContent is UNIMPLEMENTED), for the report poll tests.

Run as ``python grpcio_unary_reporter.py GEN_DIR SOCKET NAME`` where GEN_DIR holds modules that
grpc_tools compiled from the repo's .proto files. Each line ``value N`` on stdin sets what the
next GetReportContent answers; EOF stops the plugin and removes its socket.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent import futures
from typing import Any

gen_dir, socket_path, name = sys.argv[1:4]
sys.path.insert(0, gen_dir)

import grpc  # noqa: E402
from pluginregistration.v1 import api_pb2 as reg  # noqa: E402
from pluginregistration.v1 import api_pb2_grpc as reg_grpc  # noqa: E402
from reporterplugin.v1alpha1 import api_pb2 as rep  # noqa: E402
from reporterplugin.v1alpha1 import api_pb2_grpc as rep_grpc  # noqa: E402

state = {"value": 0}


class Registration(reg_grpc.RegistrationServicer):
    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return reg.PluginInfo(type="ReporterPlugin", name=name, supported_versions=["v1alpha1"])

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        print(f"notify {request.plugin_registered} {request.error}", flush=True)
        return reg.RegistrationStatusResponse()


class Reporter(rep_grpc.ReporterPluginServicer):
    def GetReportContent(self, request: Any, context: grpc.ServicerContext) -> Any:
        field = rep.ReportField(
            fieldType=rep.Status, fieldName="value", value=json.dumps(state["value"]).encode()
        )
        gvk = {"group": "node.katalyst.kubewharf.io", "version": "v1alpha1", "kind": "CNR"}
        return rep.GetReportContentResponse(
            content=[rep.ReportContent(groupVersionKind=gvk, field=[field])]
        )

    # ListAndWatchReportContent is inherited: grpcio answers UNIMPLEMENTED.


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
rep_grpc.add_ReporterPluginServicer_to_server(Reporter(), server)
server.add_insecure_port(f"unix:{socket_path}")
server.start()
print("serving", flush=True)
for line in sys.stdin:
    verb, _, arg = line.strip().partition(" ")
    if verb == "value":
        state["value"] = int(arg)
        print(f"set {arg}", flush=True)
os.unlink(socket_path)
server.stop(grace=1).wait()
