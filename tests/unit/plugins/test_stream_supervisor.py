"""The per-plugin stream supervisor, with the gRPC side scripted (fault injection) and the
clock virtual: backoff timing, clean ends, UNIMPLEMENTED, rejection, the newest message winning,
consumer bugs, rolling updates, forgetting deregistered plugins and restarts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel
from prometheus_client import REGISTRY

from nodeagent.plugins.handler import PluginEndpoint
from nodeagent.plugins.reporter_plugin import validate_report
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.streaming import StreamingHandler
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc.bridge import GrpcChannel, MessageTooLarge, RpcError, ServerStream

HANG = "hang"  # the stream stays open
CRASH = RpcError("UNAVAILABLE", "connection reset")


def _sleep(seconds: float) -> tuple[str, float]:
    """A script step: the stream stays open this long, then goes on with the next step."""
    return ("sleep", seconds)


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
    def __init__(self) -> None:
        self.checks: list[object] = []

    @asynccontextmanager
    async def channel(
        self, path: str, *, max_message_bytes: int, check: object = None
    ) -> AsyncIterator[object]:
        self.checks.append(check)
        yield object()


def _errors(kind: str) -> float:
    value = REGISTRY.get_sample_value("nodeagent_plugin_errors_total", {"kind": kind})
    return value or 0.0


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
        if isinstance(item, tuple):
            await trio.sleep(item[1])
            return await self.__anext__()
        if item == HANG:
            await trio.sleep_forever()
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, rep.GetReportContentResponse)
        return item


class _ScriptedHandler(StreamingHandler[rep.GetReportContentResponse]):
    """Each open of a plugin's stream takes the next step of that plugin's script (by socket):
    an exception (the open fails) or a list of stream items."""

    plugin_type = "ReporterPlugin"

    def __init__(self, script: list[Any] | dict[str, list[Any]], settings: PluginSettings) -> None:
        super().__init__(_FakeBridge(), settings)  # type: ignore[arg-type]
        self.scripts = script if isinstance(script, dict) else {"/r/p.sock": script}
        self.opened_at: list[float] = []
        self.opened: list[str] = []

    def validate_versions(self, plugin: PluginEndpoint) -> None:
        pass

    def open_stream(
        self, channel: GrpcChannel, plugin: PluginEndpoint
    ) -> AbstractAsyncContextManager[ServerStream[rep.GetReportContentResponse]]:
        return self._open(plugin.socket)

    @asynccontextmanager
    async def _open(self, socket: str) -> AsyncIterator[Any]:
        self.opened_at.append(trio.current_time())
        self.opened.append(socket)
        step = self.scripts[socket].pop(0)
        if isinstance(step, Exception):
            raise step
        yield _FakeStream(list(step))

    def validate_message(self, message: rep.GetReportContentResponse) -> None:
        validate_report(message)


def _plugin(socket: str = "/r/p.sock", name: str = "p") -> PluginEndpoint:
    return PluginEndpoint(name, "ReporterPlugin", socket, socket, ("v1alpha1",))


SETTINGS = PluginSettings(stream_backoff_initial=1.0, stream_backoff_max=4.0)


def _received(handler: _ScriptedHandler, name: str = "p") -> int:
    status = handler.plugin_status(name)
    return 0 if status is None else int(status["messages_received"])


def _status(handler: _ScriptedHandler, name: str = "p") -> dict[str, Any]:
    status = handler.plugin_status(name)
    assert status is not None
    return status


def _field(handler: _ScriptedHandler, name: str = "p") -> str:
    message = handler.latest.value[name].message
    assert isinstance(message, rep.GetReportContentResponse)
    return str(message.content[0].field[0].fieldName)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _wait(handler: _ScriptedHandler, predicate: Any) -> None:
    while not predicate():
        await handler.changes.wait_newer(handler.changes.version)


async def test_failed_opens_retry_at_once_then_back_off_doubling_with_jitter_up_to_the_cap(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler([CRASH] * 6 + [[_msg("ok"), HANG]], SETTINGS)
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: "p" in handler.latest.value)
    gaps = [b - a for a, b in zip(handler.opened_at, handler.opened_at[1:], strict=False)]
    assert len(gaps) == 6
    assert gaps[0] == 0  # the seed's rule: the first retry is immediate
    for gap, step in zip(gaps[1:], [1, 2, 4, 4, 4], strict=True):
        assert step / 2 <= gap <= step
    status = _status(handler)
    assert status["stream_restarts"] == 6
    assert status["stream_state"] == "open"


async def test_a_plugin_failing_right_after_each_message_backs_off_to_the_cap(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    # Every message used to reset the backoff: ~1.3 reopen warnings a second, forever.
    settings = PluginSettings(stream_backoff_initial=1.0)  # cap 180 s, healthy after 30 s
    handler = _ScriptedHandler([[_msg(f"m{i}"), CRASH] for i in range(500)], settings)
    restarts_before = _metric("nodeagent_plugin_stream_restarts_total", type="ReporterPlugin")
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await trio.sleep(900)  # virtual: 15 minutes
    opens = len(handler.opened_at)
    # At once, then ~1, 2, 4 ... 128, then every ~90-180 s: about a dozen in 15 minutes.
    assert 10 <= opens <= 16
    gaps = [b - a for a, b in zip(handler.opened_at, handler.opened_at[1:], strict=False)]
    assert all(90 <= gap <= 180 for gap in gaps[-3:])
    restarts = _metric("nodeagent_plugin_stream_restarts_total", type="ReporterPlugin")
    assert restarts - restarts_before == _status(handler)["stream_restarts"]
    assert _status(handler)["stream_restarts"] in (opens - 1, opens)  # one warning per failure
    assert _received(handler) == opens  # every message was still taken


async def test_the_backoff_restarts_only_after_a_stream_stayed_open_long_enough(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    settings = PluginSettings(stream_backoff_initial=1.0, stream_healthy_after=30.0)
    handler = _ScriptedHandler(
        [
            CRASH,
            CRASH,
            CRASH,
            [_msg("short"), _sleep(29), CRASH],  # open 29 s: not healthy, the backoff grows
            [_msg("long"), _sleep(31), CRASH],  # open 31 s: healthy, the next retry is at once
            [HANG],
        ],
        settings,
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: len(handler.opened_at) == 6)
    gaps = [b - a for a, b in zip(handler.opened_at, handler.opened_at[1:], strict=False)]
    # 0, ~1, ~2 between failed opens; then 29 s open + the next step (2..4 s); then 31 s + 0.
    assert gaps[0] == 0
    assert 29 + 2 <= gaps[3] <= 29 + 4
    assert gaps[4] == pytest.approx(31)


async def test_a_burst_is_processed_newest_first_stale_messages_skipped(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    burst = [_msg(f"m{i}") for i in range(1, 201)]
    handler = _ScriptedHandler([[*burst, HANG]], SETTINGS)
    skipped_before = _metric("nodeagent_plugin_messages_skipped_total", type="ReporterPlugin")
    publishes: list[int] = []
    await nursery.start(handler.run)
    await handler.register(_plugin())

    async def watch() -> None:
        version = handler.latest.version
        while True:
            version, _ = await handler.latest.wait_newer(version)
            publishes.append(version)

    nursery.start_soon(watch)
    await _wait(handler, lambda: "p" in handler.latest.value and _field(handler) == "m200")
    await trio.sleep(5)  # virtual: nothing more comes
    status = _status(handler)
    # The first message is taken at once, the rest of the burst waits stream_min_interval and
    # only the newest of it is processed.
    assert status["messages_received"] <= 3
    assert status["messages_received"] + status["messages_skipped"] == 200
    assert len(publishes) <= 4
    assert _field(handler) == "m200"
    skipped = _metric("nodeagent_plugin_messages_skipped_total", type="ReporterPlugin")
    assert skipped - skipped_before == status["messages_skipped"]


async def test_what_is_pending_when_the_stream_fails_is_processed_first(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler(
        [[*(_msg(f"m{i}") for i in range(1, 51)), CRASH], [HANG]],
        PluginSettings(stream_min_interval=10.0),
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: len(handler.opened_at) == 2)
    assert _field(handler) == "m50"
    assert _received(handler) == 2


async def test_a_rejected_newest_message_keeps_the_last_processed_one(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    bad = rep.GetReportContentResponse(content=[rep.ReportContent()])
    # "skipped" and the bad one arrive inside the min interval after "first", so only the bad
    # one is processed when it ends (without the interval, Trio may schedule the processor
    # between the two reads, and "skipped" is processed: a legal order, not this test's).
    settings = PluginSettings(stream_min_interval=5.0)
    handler = _ScriptedHandler([[_msg("first"), _sleep(1), _msg("skipped"), bad, HANG]], settings)
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: _status(handler)["messages_rejected"] == 1)
    status = _status(handler)
    assert (status["messages_received"], status["messages_skipped"]) == (1, 1)
    assert _field(handler) == "first"


async def test_an_unexpected_error_in_one_consumer_fails_only_that_stream(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler(
        {
            "/r/p.sock": [[_msg("a"), RuntimeError("bug in the reader")], [_msg("b"), HANG]],
            "/r/q.sock": [[_msg("q"), HANG]],
        },
        SETTINGS,
    )
    internal_before = _metric("nodeagent_plugin_errors_total", kind="stream_internal")
    await nursery.start(handler.run)
    await handler.register(_plugin("/r/q.sock", "q"))
    await handler.register(_plugin())
    await _wait(handler, lambda: "p" in handler.latest.value and _field(handler) == "b")
    status = _status(handler)
    assert status["stream_restarts"] == 1
    assert status["stream_error"] == "internal error: RuntimeError('bug in the reader')"
    assert _metric("nodeagent_plugin_errors_total", kind="stream_internal") == internal_before + 1
    assert _status(handler, "q")["stream_state"] == "open"
    assert _status(handler, "q")["stream_restarts"] == 0

    # A bug while processing a message fails the stream the same way.
    real_process = handler._process
    calls = 0

    def process_failing_once(entry: Any, stream: Any, message: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("bug in processing")
        real_process(entry, stream, message)

    handler._process = process_failing_once  # type: ignore[method-assign]
    handler.scripts["/r/p.sock"] += [[_msg("c"), HANG], [_msg("d"), HANG]]
    await handler.register(_plugin())  # re-registration: a new stream, whose first message fails
    await _wait(handler, lambda: _field(handler) == "d")
    assert _status(handler)["stream_error"] == "internal error: KeyError('bug in processing')"
    assert _status(handler, "q")["stream_state"] == "open"


async def test_clean_end_and_unimplemented_stop_without_forgetting_data(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    ended = _ScriptedHandler([[_msg("last")]], SETTINGS)
    await nursery.start(ended.run)
    await ended.register(_plugin())
    await _wait(ended, lambda: _status(ended)["stream_state"] == "ended")
    assert ended.latest.value["p"].message == _msg("last")
    assert ended.latest.value["p"].registered
    assert len(ended.opened_at) == 1

    lazy = _ScriptedHandler([RpcError("UNIMPLEMENTED", "Method not found")], SETTINGS)
    await nursery.start(lazy.run)
    await lazy.register(_plugin())
    await _wait(lazy, lambda: _status(lazy)["stream_state"] == "unimplemented")
    await trio.sleep(60)  # virtual: nothing reopens it
    assert len(lazy.opened_at) == 1


async def test_rejected_messages_keep_the_last_good_one_on_the_same_stream(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    bad = rep.GetReportContentResponse(content=[rep.ReportContent()])
    settings = PluginSettings(stream_min_interval=0.0)
    handler = _ScriptedHandler(
        [[_msg("good"), _sleep(1), bad, _sleep(1), _msg("better"), HANG]], settings
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: _received(handler) == 2)
    status = _status(handler)
    assert status["messages_rejected"] == 1
    assert status["stream_restarts"] == 0
    assert handler.latest.value["p"].message == _msg("better")


async def test_an_oversized_message_ends_its_stream_and_keeps_the_last_good_one(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    # Refused from its length prefix, the body unread: that stream cannot go on in step, so it
    # is reopened (its rejection counted once, as message_too_large, not also as a stream error).
    too_large = _errors("message_too_large")
    stream_errors = _errors("stream")
    settings = PluginSettings(stream_min_interval=0.0)
    handler = _ScriptedHandler(
        [
            [_msg("good"), _sleep(1), MessageTooLarge(5_000_000, 4_194_304), HANG],
            [_sleep(1), _msg("better"), HANG],
        ],
        settings,
    )
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: _status(handler)["messages_rejected"] == 1)
    assert handler.latest.value["p"].message == _msg("good")
    await _wait(handler, lambda: _received(handler) == 2)
    status = _status(handler)
    assert status["stream_restarts"] == 1
    assert len(handler.opened_at) == 2
    assert handler.latest.value["p"].message == _msg("better")
    assert _errors("message_too_large") == too_large + 1
    assert _errors("stream") == stream_errors


async def test_every_stream_connection_is_peer_checked(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler([[HANG]], SETTINGS)
    await nursery.start(handler.run)
    await handler.register(_plugin())
    bridge = handler._bridge
    assert isinstance(bridge, _FakeBridge)
    assert len(bridge.checks) == 1 and callable(bridge.checks[0])


async def test_newest_registration_serves_and_the_older_one_is_served_again_when_it_goes(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler(
        {
            "/r/old.sock": [[_msg("old"), HANG], [_msg("old-again"), HANG]],
            "/r/new.sock": [[_msg("new"), HANG]],
        },
        SETTINGS,
    )
    await nursery.start(handler.run)
    await handler.register(_plugin("/r/old.sock"))
    await _wait(handler, lambda: "p" in handler.latest.value)
    await handler.register(_plugin("/r/new.sock"))
    await _wait(handler, lambda: _field(handler) == "new")
    assert _status(handler)["owner_socket"] == "/r/new.sock"
    # The newest leaves while the older is still registered: the older is served again.
    await handler.deregister(_plugin("/r/new.sock"))
    assert _status(handler)["owner_socket"] == "/r/old.sock"
    await _wait(handler, lambda: _field(handler) == "old-again")
    assert handler.latest.value["p"].registered
    assert handler.opened == ["/r/old.sock", "/r/new.sock", "/r/old.sock"]
    await handler.deregister(_plugin("/r/old.sock"))
    assert not handler.latest.value["p"].registered
    assert _status(handler)["stream_state"] == "stopped"


async def test_a_standby_registration_leaving_does_not_touch_the_serving_one(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    handler = _ScriptedHandler([[_msg("old"), HANG], [HANG]], SETTINGS)
    handler.scripts = {"/r/old.sock": [[_msg("old"), HANG]], "/r/new.sock": [[HANG]]}
    await nursery.start(handler.run)
    await handler.register(_plugin("/r/old.sock"))
    await _wait(handler, lambda: "p" in handler.latest.value)
    await handler.register(_plugin("/r/new.sock"))
    assert _status(handler)["owner_socket"] == "/r/new.sock"
    assert handler.latest.value["p"].message == _msg("old")  # carried over
    await handler.deregister(_plugin("/r/old.sock"))
    assert handler.latest.value["p"].registered
    assert _status(handler)["stream_state"] == "open"
    await handler.deregister(_plugin("/r/new.sock"))
    assert not handler.latest.value["p"].registered
    assert _status(handler)["stream_state"] == "stopped"


async def test_a_deregistered_plugins_data_is_forgotten_after_the_grace(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    # Katalyst keeps a stopped endpoint's data for 5 minutes; it used to be kept forever.
    handler = _ScriptedHandler([[_msg("a"), HANG], [_msg("b"), HANG]], PluginSettings())
    expired_before = _metric("nodeagent_plugin_data_expired_total", type="ReporterPlugin")
    await nursery.start(handler.run)
    await handler.register(_plugin())
    await _wait(handler, lambda: "p" in handler.latest.value)
    await handler.deregister(_plugin())
    assert not handler.latest.value["p"].registered
    await trio.sleep(299)
    assert handler.plugin_names() == ["p"]
    # Back within the grace: nothing is forgotten, the clock starts again when it leaves.
    await handler.register(_plugin())
    await _wait(handler, lambda: _field(handler) == "b")
    await trio.sleep(600)
    assert handler.latest.value["p"].registered
    await handler.deregister(_plugin())
    await trio.sleep(299)
    assert "p" in handler.latest.value
    await trio.sleep(1.5)
    assert "p" not in handler.latest.value
    assert handler.plugin_status("p") is None
    assert handler.plugin_names() == []
    assert _metric("nodeagent_plugin_data_expired_total", type="ReporterPlugin") == (
        expired_before + 1
    )


async def test_a_restarted_handler_forgets_registrations_of_its_earlier_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = _ScriptedHandler([[_msg("a"), HANG]], SETTINGS)
    async with trio.open_nursery() as run:
        await run.start(handler.run)
        await handler.register(_plugin())
        await _wait(handler, lambda: "p" in handler.latest.value)
        run.cancel_scope.cancel()  # the manager (and so the handler) crashes or is restarted
    assert not handler.latest.value["p"].registered
    async with trio.open_nursery() as run:
        await run.start(handler.run)
        assert not handler.latest.value["p"].registered
        assert _status(handler)["stream_state"] == "stopped"
        run.cancel_scope.cancel()


async def test_register_needs_a_running_handler() -> None:
    handler = _ScriptedHandler([], SETTINGS)
    with pytest.raises(RuntimeError, match="not running"):
        await handler.register(_plugin())
