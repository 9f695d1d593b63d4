"""The one backoff policy, in the parameterisation of each of its users (the assertions are those
of the four classes it replaced: kube, plugin registration, plugin streams, component restarts;
the publisher queue's are in tests/unit/resources/test_queue.py)."""

from __future__ import annotations

import random

import pytest

from nodeagent.core.backoff import Backoff, Jitter

# --- kube requests and watches: Jitter.below(0.5), counted by next() ---------------------------


def test_backoff_grows_caps_and_resets() -> None:
    b = Backoff(initial=0.5, maximum=30)
    assert [b.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    b.reset()
    assert b.next() == 0.5


def test_backoff_jitter_stays_in_bounds() -> None:
    b = Backoff(initial=1, maximum=8, jitter=Jitter.below(0.5), random=random.Random(7).random)
    for base in [1, 2, 4, 8, 8, 8]:
        delay = b.next()
        assert base * 0.5 <= delay <= base
    delays = {
        round(Backoff(1, 8, jitter=Jitter.below(0.5), random=random.Random(s).random).next(), 6)
        for s in range(20)
    }
    assert len(delays) > 10  # jitter spreads clients apart


def test_backoff_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0, maximum=1)
    with pytest.raises(ValueError):
        Backoff(initial=2, maximum=1)
    with pytest.raises(ValueError):
        Backoff(initial=1, maximum=2, jitter=Jitter.below(1.0))
    with pytest.raises(ValueError):
        Backoff(initial=1, maximum=2, factor=0.5)
    with pytest.raises(ValueError):
        Jitter(1.2, 1.0)


# --- plugin registration (the kubelet's goroutinemap exponentialbackoff): no jitter ------------


def test_exponential_backoff_doubles_from_half_a_second_to_the_kubelet_cap() -> None:
    backoff = Backoff(0.5, 122.0)
    durations = [backoff.next() for _ in range(12)]
    assert durations[:9] == [0.5, 1, 2, 4, 8, 16, 32, 64, 122.0]
    assert durations[9:] == [122.0] * 3
    assert backoff.failures == 12
    backoff.reset()
    assert backoff.next() == 0.5


# --- plugin streams: the first retry at once, then the upper half of a capped step -------------


def stream_backoff(initial: float, cap: float, fraction: float) -> Backoff:
    return Backoff(
        initial, cap, jitter=Jitter.below(0.5), immediate_first=True, random=lambda: fraction
    )


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999])
def test_jittered_backoff_retries_at_once_then_stays_in_the_upper_half_of_a_capped_step(
    fraction: float,
) -> None:
    backoff = stream_backoff(1.0, 30.0, fraction)
    assert backoff.next() == 0.0
    steps = [1, 2, 4, 8, 16, 30, 30, 30]
    for step in steps:
        delay = backoff.next()
        assert step / 2 <= delay < step
        assert delay == pytest.approx(step / 2 + fraction * step / 2)
    backoff.reset()
    assert backoff.next() == 0.0
    assert backoff.next() < 1.0


def test_jittered_backoff_survives_very_many_attempts() -> None:
    backoff = stream_backoff(0.5, 10.0, 1.0)
    for _ in range(5000):
        delay = backoff.next()
    assert delay == 10.0


# --- component restarts: Jitter.around(fraction), failures counted by the caller ---------------


@pytest.mark.parametrize(
    ("failures", "expected"), [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (10_000, 30.0)]
)
def test_backoff_base_doubles_and_caps(failures: int, expected: float) -> None:
    assert Backoff(0.5, 30.0).base(failures) == expected


def test_backoff_jitter_stays_within_bounds() -> None:
    backoff = Backoff(1.0, 10.0, jitter=Jitter.around(0.5), random=random.Random(1).random)
    delays = [backoff.delay(3) for _ in range(200)]
    assert all(2.0 <= d <= 6.0 for d in delays)
    assert all(backoff.delay(50) <= 10.0 for _ in range(50))


# --- what the one module adds -------------------------------------------------------------------


def test_a_policy_without_jitter_draws_no_random_number() -> None:
    """A generator shared with other users (the kube client's) is not advanced by a policy
    that has no jitter."""

    def draw() -> float:
        raise AssertionError("drew a random number")

    backoff = Backoff(1.0, 4.0, random=draw)
    assert [backoff.next() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]


def test_the_delay_never_exceeds_the_maximum_even_with_jitter_above() -> None:
    backoff = Backoff(1.0, 4.0, jitter=Jitter.around(0.5), random=lambda: 0.999)
    assert backoff.delay(2) == pytest.approx(2.0 * 1.499)
    assert backoff.delay(3) == 4.0


def test_a_factor_other_than_two() -> None:
    backoff = Backoff(1.0, 100.0, factor=3.0)
    assert [backoff.next() for _ in range(6)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]
