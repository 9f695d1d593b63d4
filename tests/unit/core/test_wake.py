from __future__ import annotations

import math

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.core.wake import Deadlines, Pulse, Wake

# -- Wake -------------------------------------------------------------------------------------


async def test_sets_before_the_waiter_looks_are_one_wake_up(
    autojump_clock: trio.abc.Clock,
) -> None:
    wake = Wake()
    wake.set()
    wake.set()
    with trio.fail_after(1):
        await wake.wait()
    assert not wake.is_set()
    assert await wake.wait_for(5) is False
    assert trio.current_time() == 5


async def test_a_set_while_the_waiter_sleeps_wakes_it(autojump_clock: trio.abc.Clock) -> None:
    wake = Wake()
    woken_at: list[float] = []

    async def waiter() -> None:
        assert await wake.wait_until(100)
        woken_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(3)
        wake.set()
    assert woken_at == [3]
    assert not wake.is_set()


async def test_clear_withdraws_a_wake_up_not_consumed(autojump_clock: trio.abc.Clock) -> None:
    wake = Wake()
    wake.set()
    wake.clear()
    assert not wake.is_set()
    assert await wake.wait_for(1) is False
    wake.clear()  # clearing a clear flag is a no-op
    wake.set()
    assert await wake.wait_for(1) is True


# -- Pulse ------------------------------------------------------------------------------------


async def test_a_fire_wakes_every_waiter_and_a_fire_before_waiting_is_lost(
    autojump_clock: trio.abc.Clock,
) -> None:
    pulse = Pulse()
    pulse.fire()  # nobody waits: lost
    woken: list[int] = []

    async def waiter(i: int, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await pulse.wait()
        woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            await nursery.start(waiter, i)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        pulse.fire()
    assert sorted(woken) == [0, 1, 2]
    with trio.move_on_after(10) as scope:
        await pulse.wait()
    assert scope.cancelled_caught


# -- Deadlines --------------------------------------------------------------------------------


async def test_wait_due_returns_the_due_keys_at_the_earliest_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    deadlines: Deadlines[str] = Deadlines()
    deadlines.set("b", 5)
    deadlines.set("a", 5)
    deadlines.set("c", 9)
    assert deadlines.next() == 5 and len(deadlines) == 3 and "a" in deadlines
    assert await deadlines.wait_due() == ["b", "a"]  # same deadline: in the order set
    assert trio.current_time() == 5
    deadlines.discard("c")
    assert deadlines.next() == math.inf and deadlines.get("c") is None
    with trio.move_on_after(100) as scope:
        await deadlines.wait_due()
    assert scope.cancelled_caught


async def test_a_deadline_set_earlier_while_waiting_replans_the_sleep(
    autojump_clock: trio.abc.Clock,
) -> None:
    deadlines: Deadlines[str] = Deadlines()
    deadlines.set("late", 100)
    got: list[tuple[float, list[str]]] = []

    async def expirer() -> None:
        while len(got) < 2:
            due = await deadlines.wait_due()
            got.append((trio.current_time(), due))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(expirer)
        await trio.sleep(1)
        deadlines.set_after("soon", 2)
        deadlines.set("late", 50)  # moved: replaces the old deadline
    assert got == [(3, ["soon"]), (50, ["late"])]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcde"), st.one_of(st.none(), st.integers(0, 20))),
        max_size=15,
    )
)
def test_deadlines_expire_each_key_at_its_last_deadline(
    ops: list[tuple[str, int | None]],
) -> None:
    """Against a dict model: each key set (None: discarded) at time 0 comes out once, at its
    last deadline, grouped with the keys of the same deadline."""

    async def main() -> list[tuple[float, list[str]]]:
        deadlines: Deadlines[str] = Deadlines()
        for key, at in ops:
            if at is None:
                deadlines.discard(key)
            else:
                deadlines.set(key, at)
        out: list[tuple[float, list[str]]] = []
        while len(deadlines):
            due = await deadlines.wait_due()
            out.append((trio.current_time(), sorted(due)))
        return out

    model: dict[str, int] = {}
    for key, at in ops:
        if at is None:
            model.pop(key, None)
        else:
            model[key] = at
    expected = [
        (float(t), sorted(k for k, at in model.items() if at == t))
        for t in sorted(set(model.values()))
    ]
    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == expected
