"""A hostile reporter plugin, run as its own process so the agent's memory is measured alone.

``python hostile_plugin.py REGISTRY_DIR NAME MODE ANNOUNCE`` registers NAME (a ReporterPlugin)
in REGISTRY_DIR and serves its endpoint at ``REGISTRY_DIR-NAME.sock``. MODE says which reply is
hostile:

- ``stream``: the first ListAndWatchReportContent stream sends a good report (field ``good``),
  then a message whose gRPC prefix announces ANNOUNCE bytes, and streams zeros for it until the
  agent stops granting HTTP/2 window; every later stream sends field ``after`` and stays open.
- ``poll``: GetReportContent answers with such a message (the stream sends ``good``, stays open).
- ``getinfo``: GetInfo answers with such a message.

Once the hostile body is stuck (no window for 1 s) or refused (stream reset), the plugin prints
``sent N`` (body bytes it could write) on stdout. EOF on stdin stops it.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from typing import Any

from grpclib.server import Server, Stream

from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep

CHUNK = 64 * 1024
STUCK_AFTER = 1.0


def report(field: str) -> rep.GetReportContentResponse:
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[rep.ReportField(fieldType=rep.Status, fieldName=field, value=b"1")],
            )
        ]
    )


async def send_hostile(stream: Stream[Any, Any], announce: int) -> None:
    """Send headers, then a message prefix announcing `announce` bytes, then zeros for it
    through grpclib's flow-controlled writer until the window stays shut or the stream dies."""
    if not stream._send_initial_metadata_done:
        await stream.send_initial_metadata()
    h2_stream = stream._stream
    await h2_stream.send_data(struct.pack("?", False) + struct.pack(">I", announce))
    sent = 0
    chunk = bytes(CHUNK)
    try:
        while sent < announce:
            size = min(CHUNK, announce - sent)
            await asyncio.wait_for(h2_stream.send_data(chunk[:size]), STUCK_AFTER)
            sent += size
    except TimeoutError:
        outcome = "stuck"
    except asyncio.CancelledError:  # grpclib cancels the handler when the agent resets
        print(f"sent {sent} reset", flush=True)
        raise
    except Exception as exc:  # the connection closed
        outcome = f"failed ({type(exc).__name__})"
    else:
        outcome = "complete"
    print(f"sent {sent} {outcome}", flush=True)
    # Leave the stream to its fate (the agent reset it): wait until cancelled.
    await asyncio.Event().wait()


class Registration(reg_grpc.RegistrationBase):
    def __init__(self, name: str, endpoint: str, mode: str, announce: int) -> None:
        self.name, self.endpoint, self.mode, self.announce = name, endpoint, mode, announce

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await stream.recv_message()
        if self.mode == "getinfo":
            await send_hostile(stream, self.announce)
            return
        await stream.send_message(
            reg.PluginInfo(
                type="ReporterPlugin",
                name=self.name,
                endpoint=self.endpoint,
                supported_versions=["v1alpha1"],
            )
        )

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg.RegistrationStatus, reg.RegistrationStatusResponse]
    ) -> None:
        status = await stream.recv_message()
        assert status is not None
        print(f"notify {status.plugin_registered} {status.error}", flush=True)
        await stream.send_message(reg.RegistrationStatusResponse())


class Reporter(rep_grpc.ReporterPluginBase):
    def __init__(self, mode: str, announce: int) -> None:
        self.mode, self.announce = mode, announce
        self.streams = 0

    async def GetReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        if self.mode == "poll":
            await send_hostile(stream, self.announce)
            return
        await stream.send_message(report("good"))

    async def ListAndWatchReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        self.streams += 1
        if self.mode == "stream" and self.streams == 1:
            await stream.send_message(report("good"))
            await send_hostile(stream, self.announce)
            return
        await stream.send_message(report("after" if self.mode == "stream" else "good"))
        await asyncio.Event().wait()


async def main() -> None:
    registry, name, mode, announce_text = sys.argv[1:5]
    announce = int(announce_text)
    # Beside the registry (in the default endpoint_dirs), not in it: every socket in the
    # registry tree is taken for a registration socket.
    service_socket = f"{registry.rstrip('/')}-{name}.sock"
    reg_socket = os.path.join(registry, f"{name}.sock")
    service = Server([Reporter(mode, announce)])
    await service.start(path=service_socket)
    registration = Server([Registration(name, service_socket, mode, announce)])
    await registration.start(path=reg_socket)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    registration.close()
    service.close()
    for path in (reg_socket, service_socket):
        os.unlink(path)


if __name__ == "__main__":
    asyncio.run(main())
