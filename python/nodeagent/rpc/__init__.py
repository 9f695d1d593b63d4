"""The Trio-facing gRPC bridge (`bridge`): grpclib on one asyncio loop in its own thread, unix
sockets.

A leaf of its own: the agent's plugin manager dials plugins through it and the SDK serves
plugins through it, so neither imports the other. It imports nothing of nodeagent.
"""

from nodeagent.rpc.bridge import (
    ConnectCheck,
    GrpcBridge,
    GrpcChannel,
    MalformedMessage,
    MessageRejected,
    MessageTooLarge,
    RpcError,
    ServerStream,
    open_grpc_bridge,
    run_in_trio,
)

__all__ = [
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
]
