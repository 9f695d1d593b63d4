"""The per-plugin stream supervisor, with the gRPC side scripted (fault injection) and the
clock virtual: backoff timing, clean ends, UNIMPLEMENTED, rejection and re-registration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel

from nodeagent.plugins.bridge import GrpcChannel, MessageTooLarge, RpcError, ServerStream
from nodeagent.plugins.handler import PluginEndpoint, StreamingHandler
from nodeagent.plugins.reporter import validate_report
from nodeagent.plugins.settings import PluginSettings
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep

HANG = "hang"  # the stream stays open
CRASH = RpcError("UNAVAILABLE", "connection reset")


def _msg(name: str) -> rep.GetReportContentResponse:
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1", "kind": "K"},
                field=[rep.ReportField(fieldName=name, value=b"1")],
            )
        ]
    )


class _FakeBridge:
    @asynccontextmanager
    async def channel(self, path: str, *, max_message_bytes: int) -> AsyncIterator[object]:
        yield object()


class _FakeStream:
    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __aiter__(self) -> _FakeStream:
        return self

    async def __anext__(self) -> rep.GetReportContentResponse:
        await trio.lowlevel.checkpoint()
        if not self._items:
            raise StopAsyncIteration
        item = self._items.pop(0)
        if item == HANG:
            await trio.sleep_forever()
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, rep.GetReportContentResponse)
        return item


class _ScriptedHandler(StreamingHandler[rep.GetReportContentResponse]):
    plugin_type = "ReporterPlugin"

    def __init__(self, script: list[Any], settings: PluginSettings) -> None:
        super().__init__(_FakeBridge(), settings)  # type: ignore[arg-type]
        self.script = script
        self.opened_at: list[float] = []

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        pass

    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[rep.GetReportContentResponse]]:
        return self._open()

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Any]:
        self.opened_at.append(trio.current_time())
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        yield _FakeStream(list(step))

    def validate_message(self, message: rep.GetReportContentResponse) -> None:
        validate_report(message)


def _plugin(socket: str = "/r/p.sock") -> PluginEndpoint:
    return PluginEndpoint("p", "ReporterPlugin", socket, socket, ("v1alpha1",))


SETTINGS = PluginSettings(stream_backoff_initial=1.0, stream_backoff_max=4.0)


def _received(handler: _ScriptedHandler) -> int:
    status = handler.plugin_status("p")
    return 0 if status is None else int(status["messages_received"])


async def _wait(handler: _ScriptedHandler, predicate: Any) -> None:
    while not predicate():
        await handler.changes.wait_newer(handler.changes.version)


async def test_failed_opens_back_off_doubling_with_jitter_up_to_the_cap(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler([CRASH] * 5 + [[_msg("ok"), HANG]], SETTINGS)
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: "p" in handler.latest.value)
    gaps = [b - a for a, b in zip(handler.opened_at, handler.opened_at[1:], strict=False)]
    assert len(gaps) == 5
    for gap, step in zip(gaps, [1, 2, 4, 4, 4], strict=True):
        assert step / 2 <= gap <= step
    status = handler.plugin_status("p")
    assert status is not None
    assert status["stream_restarts"] == 5
    assert status["stream_state"] == "open"


async def test_a_good_message_resets_the_backoff(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler(
        [CRASH, CRASH, CRASH, [_msg("a"), CRASH], [_msg("b"), HANG]], SETTINGS
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(
        handler,
        lambda: (
            len(handler.opened_at) == 5 and handler.plugin_status("p")["messages_received"] == 2
        ),
    )  # type: ignore[index]
    last_gap = handler.opened_at[4] - handler.opened_at[3]
    assert 0.5 <= last_gap <= 1.0  # back to the initial step after data flowed


async def test_clean_end_and_unimplemented_stop_without_forgetting_data(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    ended = _ScriptedHandler([[_msg("last")]], SETTINGS)
    await nursery.start(ended.run)
    await ended.register(_plugin())
    await _wait(ended, lambda: ended.plugin_status("p")["stream_state"] == "ended")  # type: ignore[index]
    assert ended.latest.value["p"].message == _msg("last")
    assert ended.latest.value["p"].registered
    assert len(ended.opened_at) == 1

    lazy = _ScriptedHandler([RpcError("UNIMPLEMENTED", "Method not found")], SETTINGS)
    await nursery.start(lazy.run)
    await lazy.register(_plugin())
    await _wait(lazy, lambda: lazy.plugin_status("p")["stream_state"] == "unimplemented")  # type: ignore[index]
    await trio.sleep(60)  # virtual: nothing reopens it
    assert len(lazy.opened_at) == 1


async def test_rejected_messages_keep_the_last_good_one_on_the_same_stream(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    bad = rep.GetReportContentResponse(content=[rep.ReportContent()])
    handler = _ScriptedHandler(
        [[_msg("good"), MessageTooLarge(5_000_000, 4_194_304), bad, _msg("better"), HANG]],
        SETTINGS,
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: _received(handler) == 2)
    status = handler.plugin_status("p")
    assert status is not None
    assert status["messages_rejected"] == 2
    assert status["stream_restarts"] == 0
    assert handler.latest.value["p"].message == _msg("better")


async def test_re_registration_cancels_the_old_stream_and_keeps_its_data(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler([[_msg("old"), HANG], [HANG]], SETTINGS)
    await nursery.start(handler.run)
    await handler.register(_plugin("/r/old.sock"))
    await _wait(handler, lambda: "p" in handler.latest.value)
    await handler.register(_plugin("/r/new.sock"))
    assert handler.plugin_status("p")["owner_socket"] == "/r/new.sock"  # type: ignore[index]
    assert handler.latest.value["p"].message == _msg("old")  # carried over
    # The replaced socket leaving does not touch the new owner.
    await handler.deregister(_plugin("/r/old.sock"))
    assert handler.latest.value["p"].registered
    await handler.deregister(_plugin("/r/new.sock"))
    assert not handler.latest.value["p"].registered
    assert handler.plugin_status("p")["stream_state"] == "stopped"  # type: ignore[index]


async def test_register_needs_a_running_handler() -> None:
    handler = _ScriptedHandler([], SETTINGS)
    with pytest.raises(RuntimeError, match="not running"):
        await handler.register(_plugin())
