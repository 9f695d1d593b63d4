"""An identical re-send costs next to nothing (issue 29 item 13b): one plugin with 8,192 devices
re-sending the same inventory at 10 Hz put `/healthz` p99 at 270-331 ms. A stream's message whose
bytes are those of the message before is not decoded again (the bridge hands back the same
object), and the handler counts it without validating, converting or publishing it; readiness
(every heartbeat) no longer renders the last message as a dict, and status renders it once per
message. The latency figures are `benches/bench_resend.py`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from nodeagent.plugins import DraHandler, PluginManager, streaming
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.rpc import GrpcBridge
from nodeagent.rpc._grpc import LimitedProtoCodec, StreamCodec
from nodeagent.sdk import Device, DevicePlugin
from tests.plugins.support import WAIT, inventory_of, status_item, wait_until

NAME = "resend.example.com"


def test_the_stream_codec_hands_back_the_message_before_for_the_same_bytes() -> None:
    codec = StreamCodec(1 << 20)
    one = device_pb2.Inventory(pools=[device_pb2.Pool(name="a")]).SerializeToString()
    two = device_pb2.Inventory(pools=[device_pb2.Pool(name="b")]).SerializeToString()
    first = codec.decode(one, device_pb2.Inventory)
    assert codec.decode(bytes(one), device_pb2.Inventory) is first  # equal bytes, not the object
    second = codec.decode(two, device_pb2.Inventory)
    assert second is not first and second.pools[0].name == "b"
    assert codec.decode(one, device_pb2.Inventory) is not first  # only the message before
    # Another type from the same bytes is decoded as that type.
    assert type(codec.decode(one, device_pb2.Pool)) is device_pb2.Pool
    # A plain codec (unary calls) decodes every time.
    plain = LimitedProtoCodec(1 << 20)
    assert plain.decode(one, device_pb2.Inventory) is not plain.decode(one, device_pb2.Inventory)


async def test_an_identical_resend_is_counted_and_nothing_else(
    manager: PluginManager,
    bridge: GrpcBridge,
    registry: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dra = manager._handlers["DRAPlugin"]
    assert isinstance(dra, DraHandler)
    validated: list[Any] = []
    rendered: list[Any] = []
    validate, to_dict = dra.validate_message, streaming._to_dict

    def validating(message: Any) -> None:
        validated.append(message)
        validate(message)

    def rendering(message: Any) -> dict[str, Any]:
        rendered.append(message)
        return to_dict(message)

    monkeypatch.setattr(dra, "validate_message", validating)
    monkeypatch.setattr(streaming, "_to_dict", rendering)
    channel = manager.channel("DRAPlugin")
    devices = [Device(f"dev-{i}", {"index": i}, capacity={"memory": "1Gi"}) for i in range(512)]
    async with DevicePlugin.serve(name=NAME, registry_dir=registry, bridge=bridge) as plugin:
        await plugin.publish(devices)
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        await wait_until(manager, lambda: NAME in channel.value)
        published, version = channel.value[NAME].message, channel.version
        assert len(validated) == 1
        rendered.clear()
        received = status_item(manager, NAME)["messages_received"]
        message = plugin.latest.value
        assert message is not None

        def counted(n: int) -> Callable[[], bool]:
            return lambda: status_item(manager, NAME)["messages_received"] >= received + n

        for n in range(1, 6):
            await plugin.publish_message(message)  # the same inventory, sent again
            await wait_until(manager, counted(n))
        # Counted, and nothing else: not validated, nothing published.
        assert len(validated) == 1
        assert channel.version == version and channel.value[NAME].message is published
        # Status (asked at every wait above) rendered the message once.
        shown = status_item(manager, NAME)["last_message"]
        assert rendered == [published] and len(shown["pools"][0]["devices"]) == 512
        # A change goes the whole way again ...
        await plugin.publish(devices[:-1])
        await wait_until(manager, lambda: channel.version > version)
        assert len(validated) == 2
        changed = inventory_of(channel.value[NAME])
        assert len(changed.pools[0].devices) == 511
        # ... and readiness (every heartbeat) never renders it; status does, once.
        for _ in range(3):
            assert manager.readiness()[0]
        assert rendered == [published]
        status_item(manager, NAME)
        status_item(manager, NAME)
        assert rendered == [published, changed]
