"""The Trio-facing gRPC bridge (`bridge`): grpclib inside one trio-asyncio loop, unix sockets.

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
]
