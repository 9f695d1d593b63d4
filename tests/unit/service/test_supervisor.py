from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from nodeagent.core.component import FatalError, Readiness
from nodeagent.service.metrics import COMPONENT_READY, COMPONENT_RESTARTS
from nodeagent.service.supervisor import Supervisor


class Flaky:
    """Fails its first `failures` starts, then runs until cancelled."""

    def __init__(self, name: str, failures: int, *, fail_after_start: bool = False) -> None:
        self.name = name
        self.failures = failures
        self.fail_after_start = fail_after_start
        self.attempts: list[float] = []
        self.running = trio.Event()
        self.ready: Readiness = (True, "fine")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.attempts.append(trio.current_time())
        if len(self.attempts) <= self.failures:
            if self.fail_after_start:
                task_status.started()
                await trio.sleep(1)
            raise RuntimeError(f"boom {len(self.attempts)}")
        task_status.started()
        self.running.set()
        await trio.sleep_forever()

    def readiness(self) -> Readiness:
        return self.ready


def restarts(name: str) -> float:
    return COMPONENT_RESTARTS.labels(component=name)._value.get()


async def test_failed_component_restarts_with_exponential_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp = Flaky("sup-backoff", failures=4)
    sup = Supervisor([comp], backoff_initial=1.0, backoff_max=5.0, jitter=0.0)
    before = restarts("sup-backoff")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await comp.running.wait()
        await trio.testing.wait_all_tasks_blocked()
        gaps = [b - a for a, b in zip(comp.attempts, comp.attempts[1:], strict=False)]
        assert gaps == pytest.approx([1.0, 2.0, 4.0, 5.0])
        report = sup.report()[0]
        assert report.ready and report.restarts == 4
        assert report.last_error == "RuntimeError: boom 4"
        nursery.cancel_scope.cancel()
    assert restarts("sup-backoff") - before == 4


async def test_backoff_is_jittered_within_bounds(autojump_clock: trio.testing.MockClock) -> None:
    comp = Flaky("sup-jitter", failures=3)
    sup = Supervisor([comp], backoff_initial=10.0, backoff_max=100.0, rng=random.Random(7))
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await comp.running.wait()
        await trio.testing.wait_all_tasks_blocked()
        gaps = [b - a for a, b in zip(comp.attempts, comp.attempts[1:], strict=False)]
        for gap, base in zip(gaps, [10.0, 20.0, 40.0], strict=True):
            assert base * 0.8 <= gap <= base * 1.2
        assert len(set(gaps)) == 3
        nursery.cancel_scope.cancel()


async def test_failing_component_is_not_ready_with_the_error_until_it_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp = Flaky("sup-ready", failures=1)
    good = Flaky("sup-good", failures=0)
    sup = Supervisor([comp, good], backoff_initial=10.0, jitter=0.0)
    async with trio.open_nursery() as nursery:
        # Start-up does not wait for the failing component to recover.
        await nursery.start(sup.run)
        assert trio.current_time() == pytest.approx(0.0)
        bad_report, good_report = sup.report()
        assert not bad_report.ready
        assert bad_report.phase == "backoff"
        assert bad_report.reason == "failed: RuntimeError: boom 1"
        assert bad_report.restart_in == pytest.approx(10.0)
        assert COMPONENT_READY.labels(component="sup-ready")._value.get() == 0
        assert good_report.ready and good_report.reason == "fine"
        await comp.running.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert sup.report()[0].ready
        assert COMPONENT_READY.labels(component="sup-ready")._value.get() == 1
        nursery.cancel_scope.cancel()


async def test_component_readiness_is_reported(autojump_clock: trio.testing.MockClock) -> None:
    comp = Flaky("sup-own", failures=0)
    sup = Supervisor([comp])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        comp.ready = (False, "waiting for plugins")
        assert [(r.ready, r.reason) for r in sup.report()] == [(False, "waiting for plugins")]

        def broken() -> Readiness:
            raise KeyError("x")

        comp.readiness = broken  # type: ignore[method-assign]
        report = sup.report()[0]
        assert not report.ready and "readiness check failed" in report.reason
        nursery.cancel_scope.cancel()


async def test_component_that_returns_is_restarted(autojump_clock: trio.testing.MockClock) -> None:
    class OneShot:
        name = "sup-oneshot"
        runs = 0

        async def run(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
        ) -> None:
            self.runs += 1
            task_status.started()

    comp = OneShot()
    sup = Supervisor([comp], backoff_initial=1.0, backoff_max=1.0, jitter=0.0)
    with trio.move_on_after(3.5):
        await sup.run()
    assert comp.runs == 4
    assert sup.states["sup-oneshot"].last_error == "exited unexpectedly"


async def test_healthy_run_resets_the_backoff(autojump_clock: trio.testing.MockClock) -> None:
    comp = Flaky("sup-reset", failures=3, fail_after_start=True)
    sup = Supervisor([comp], backoff_initial=1.0, backoff_max=100.0, reset_after=1.0, jitter=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await comp.running.wait()
        await trio.testing.wait_all_tasks_blocked()
        # Each failed attempt ran 1 s (>= reset_after), so every backoff is the initial one.
        gaps = [b - a for a, b in zip(comp.attempts, comp.attempts[1:], strict=False)]
        assert gaps == pytest.approx([2.0, 2.0, 2.0])
        nursery.cancel_scope.cancel()


async def test_fatal_error_stops_everything(autojump_clock: trio.testing.MockClock) -> None:
    class Fatal:
        name = "sup-fatal"

        async def run(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
        ) -> None:
            raise FatalError("cannot continue")

    sup = Supervisor([Fatal(), Flaky("sup-other", 0)])
    with pytest.RaisesGroup(
        pytest.RaisesExc(FatalError, match="cannot continue"), flatten_subgroups=True
    ):
        await sup.run()


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        Supervisor([Flaky("same", 0), Flaky("same", 0)])
