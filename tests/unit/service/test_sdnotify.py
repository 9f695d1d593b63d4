from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from nodeagent.service.heartbeat import Heartbeat
from nodeagent.service.metrics import SD_NOTIFY_ERRORS
from nodeagent.service.sdnotify import SystemdNotifier, encode, socket_address, watchdog_interval


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_message_format() -> None:
    assert encode(READY=1, STATUS="up") == b"READY=1\nSTATUS=up"
    assert encode(STATUS="a\nb") == b"STATUS=a b"


def test_abstract_socket_address() -> None:
    assert socket_address("@nodeagent/notify") == b"\0nodeagent/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "abc"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_our_pid(
    env: dict[str, str], expected: float | None
) -> None:
    assert watchdog_interval(env, 4242) == expected


def test_notifier_sends_datagrams(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = SystemdNotifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}, pid=1)
    assert notifier.watchdog_interval == 1.0
    assert notifier.ready("serving")
    assert sock.recv(4096) == f"READY=1\nSTATUS=serving\nMAINPID={os.getpid()}".encode()
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping("bye")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=bye"
    notifier.close()


def test_notifier_abstract_socket() -> None:
    name = f"nodeagent-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        assert SystemdNotifier(f"@{name}").status("hi")
        assert sock.recv(100) == b"STATUS=hi"


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = SystemdNotifier.from_env({}, pid=1)
    assert not notifier.enabled
    assert notifier.ready("x") is False


def test_send_failure_is_counted_not_raised(tmp_path: Path) -> None:
    before = SD_NOTIFY_ERRORS._value.get()
    assert SystemdNotifier(str(tmp_path / "nobody-listens")).status("x") is False
    assert SD_NOTIFY_ERRORS._value.get() == before + 1


class RecordingNotifier(SystemdNotifier):
    def __init__(self, watchdog: float | None) -> None:
        super().__init__(None, watchdog)
        self.pings: list[float] = []

    def watchdog(self) -> bool:
        self.pings.append(trio.current_time())
        return True


async def test_watchdog_pings_at_half_watchdog_usec(autojump_clock: trio.testing.MockClock) -> None:
    notifier = RecordingNotifier(watchdog=15.0)
    heartbeat = Heartbeat(1.0, notifier, stale_after=5.0)
    with trio.move_on_after(61):
        await heartbeat.run()
    assert notifier.pings == pytest.approx([0.0, 15.0, 30.0, 45.0, 60.0])
    assert heartbeat.ticks >= 61


async def test_watchdog_interval_shorter_than_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    notifier = RecordingNotifier(watchdog=0.25)
    heartbeat = Heartbeat(1.0, notifier, stale_after=5.0)
    with trio.move_on_after(1.1):
        await heartbeat.run()
    assert notifier.pings == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


async def test_no_watchdog_no_pings(autojump_clock: trio.testing.MockClock) -> None:
    notifier = RecordingNotifier(watchdog=None)
    with trio.move_on_after(10):
        await Heartbeat(1.0, notifier, stale_after=5.0).run()
    assert notifier.pings == []


async def test_liveness_goes_stale_when_ticks_stop(autojump_clock: trio.testing.MockClock) -> None:
    heartbeat = Heartbeat(1.0, RecordingNotifier(None), stale_after=5.0)
    assert heartbeat.liveness() == (False, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(heartbeat.run)
        await trio.sleep(30)
        alive, age = heartbeat.liveness()
        assert alive and age is not None and age <= 1.0
        nursery.cancel_scope.cancel()
    await trio.sleep(5.5)
    alive, age = heartbeat.liveness()
    assert not alive and age == pytest.approx(5.5, abs=1.0)
