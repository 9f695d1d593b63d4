from __future__ import annotations

import pytest

from nodeagent.plugins.backoff import ExponentialBackoff, JitteredBackoff


def test_exponential_backoff_doubles_from_half_a_second_to_the_kubelet_cap() -> None:
    backoff = ExponentialBackoff(0.5, 122.0)
    assert backoff.ready_at() == float("-inf")
    durations = []
    for attempt in range(12):
        backoff.record_failure(now=100.0 + attempt)
        durations.append(backoff.duration)
    assert durations[:9] == [0.5, 1, 2, 4, 8, 16, 32, 64, 122.0]
    assert durations[9:] == [122.0] * 3
    assert backoff.ready_at() == 111.0 + 122.0
    assert backoff.failures == 12
    backoff.reset()
    assert backoff.ready_at() == float("-inf")
    backoff.record_failure(now=5.0)
    assert backoff.duration == 0.5


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.999])
def test_jittered_backoff_retries_at_once_then_stays_in_the_upper_half_of_a_capped_step(
    fraction: float,
) -> None:
    backoff = JitteredBackoff(1.0, 30.0, random_fraction=lambda: fraction)
    assert backoff.next_delay() == 0.0
    steps = [1, 2, 4, 8, 16, 30, 30, 30]
    for step in steps:
        delay = backoff.next_delay()
        assert step / 2 <= delay < step
        assert delay == pytest.approx(step / 2 + fraction * step / 2)
    backoff.reset()
    assert backoff.next_delay() == 0.0
    assert backoff.next_delay() < 1.0


def test_jittered_backoff_survives_very_many_attempts() -> None:
    backoff = JitteredBackoff(0.5, 10.0, random_fraction=lambda: 1.0)
    for _ in range(5000):
        delay = backoff.next_delay()
    assert delay == 10.0
