from __future__ import annotations

import pytest
import trio
import trio.testing

from nodeagent.kube.ratelimit import TokenBucket


async def test_burst_then_steady_rate(autojump_clock: trio.testing.MockClock) -> None:
    bucket = TokenBucket(qps=10, burst=5)
    start = trio.current_time()
    waits = [await bucket.acquire() for _ in range(15)]
    assert waits[:5] == [0.0] * 5
    # The next ten come at 10 per second.
    assert trio.current_time() - start == pytest.approx(1.0)
    assert all(w == pytest.approx(0.1) for w in waits[5:])


async def test_tokens_refill_up_to_burst(autojump_clock: trio.testing.MockClock) -> None:
    bucket = TokenBucket(qps=2, burst=3)
    for _ in range(3):
        assert await bucket.acquire() == 0.0
    await trio.sleep(100)  # idle time saves up at most `burst` tokens
    assert [await bucket.acquire() for _ in range(3)] == [0.0] * 3
    assert await bucket.acquire() == pytest.approx(0.5)


async def test_concurrent_waiters_share_the_rate(autojump_clock: trio.testing.MockClock) -> None:
    bucket = TokenBucket(qps=4, burst=1)
    done: list[float] = []

    async def one() -> None:
        await bucket.acquire()
        done.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(9):
            nursery.start_soon(one)
    assert [round(t - start, 6) for t in sorted(done)] == [i * 0.25 for i in range(9)]


async def test_cancelled_waiter_returns_its_token(autojump_clock: trio.testing.MockClock) -> None:
    bucket = TokenBucket(qps=1, burst=1)
    await bucket.acquire()
    with trio.move_on_after(0.1):
        await bucket.acquire()  # would wait 1 s
    start = trio.current_time()
    await bucket.acquire()
    assert trio.current_time() - start == pytest.approx(0.9)


def test_bucket_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="qps"):
        TokenBucket(qps=0, burst=1)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(qps=1, burst=0)
