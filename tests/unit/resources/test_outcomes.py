"""`PoolOutcomes` on its own: failure streaks reported once and ended by a success, a conflict's
stale state and a refused desired state holding the pool back until they change or their wait
passes, refusals reported once per reason, dropped fields reported with their gate."""

from __future__ import annotations

from nodeagent.kube import EventRecorder
from nodeagent.kube.errors import Invalid
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired
from nodeagent.resources.outcomes import CONFLICT_STALE_WAIT, Deferral, Deferred, PoolOutcomes

KEY = ("gpu.example.com", "pool-a")


class Recorder(EventRecorder):
    def __init__(self) -> None:
        super().__init__("node-a")
        self.warned: list[tuple[str, str]] = []

    def warn(self, reason: str, message: str) -> None:
        self.warned.append((reason, message))


def desired(spec: bytes = b"{}") -> Desired:
    return Desired((spec,), [])


def reasons(events: Recorder) -> list[str]:
    return [r for r, _ in events.warned]


def test_a_failure_streak_is_reported_once_and_ended_by_a_success() -> None:
    events = Recorder()
    outcomes = PoolOutcomes(events)
    before = metrics.SYNCS.labels("failed")._value.get()
    outcomes.failed(KEY, "failed", "boom", 1)
    outcomes.failed(KEY, "failed", "bang", 2)
    assert metrics.SYNCS.labels("failed")._value.get() == before + 2
    assert outcomes.failing() == {KEY: "bang"}
    assert reasons(events) == ["ResourceSliceSyncFailed"]
    outcomes.succeeded(KEY, None)
    assert outcomes.failing() == {}
    outcomes.failed(KEY, "error", "again", 1)  # a new streak: reported again
    assert reasons(events) == ["ResourceSliceSyncFailed"] * 2


def test_a_conflict_holds_the_pool_until_a_newer_state_or_its_wait() -> None:
    outcomes = PoolOutcomes(Recorder())
    d = desired()
    outcomes.failed(KEY, "failed", "409", 1)
    outcomes.conflicted(KEY, {"a": "1"}, now=10.0)
    held = outcomes.held(KEY, {"a": "1"}, d, now=10.25)
    assert held == Deferred(Deferral.STALE, 10.0 + CONFLICT_STALE_WAIT - 10.25)
    assert outcomes.stale(KEY)
    outcomes.succeeded(KEY, held)  # only waited: still failing, its backoff keeps growing
    assert outcomes.failing() == {KEY: "409"}
    # A newer observed state: the retry goes ahead.
    assert outcomes.held(KEY, {"a": "2"}, d, now=10.5) is None
    assert not outcomes.stale(KEY)
    outcomes.succeeded(KEY, None)
    assert outcomes.failing() == {}
    # The same state, its wait over (the watch may be down): the retry goes ahead too.
    outcomes.conflicted(KEY, {"a": "1"}, now=20.0)
    assert outcomes.held(KEY, {"a": "1"}, d, now=20.0 + CONFLICT_STALE_WAIT) is None


def test_a_refused_desired_state_waits_until_it_changes_or_the_retry() -> None:
    events = Recorder()
    outcomes = PoolOutcomes(events)
    d1, d2 = desired(b'{"a":1}'), desired(b'{"a":2}')
    exc = Invalid(422, "Invalid", "spec.devices[0].name: Invalid value")
    assert outcomes.refused_by_server(KEY, exc, d1, now=0.0, retry=60.0) == Deferred(
        Deferral.INVALID, 60.0
    )
    assert outcomes.refused_by_server(KEY, exc, d1, now=1.0, retry=60.0).again == 60.0
    assert reasons(events) == ["ResourceSlicePoolInvalid"]  # the same refusal: once
    assert outcomes.invalid() == {KEY}
    assert "422 Invalid" in outcomes.failing()[KEY]
    held = outcomes.held(KEY, {}, d1, now=11.0)
    assert held == Deferred(Deferral.INVALID, 50.0)
    outcomes.succeeded(KEY, held)  # only waited out the refusal
    assert outcomes.invalid() == {KEY}
    assert outcomes.held(KEY, {}, d1, now=61.0) is None  # the retry interval passed
    assert outcomes.held(KEY, {}, d2, now=12.0) is None  # a new desired state
    outcomes.succeeded(KEY, None)
    assert outcomes.invalid() == set() and outcomes.failing() == {}


def test_a_refused_pool_is_reported_once_per_reason_until_it_fails_otherwise() -> None:
    events = Recorder()
    outcomes = PoolOutcomes(events)
    outcomes.refuse(KEY, "foreign slices x")
    outcomes.refuse(KEY, "foreign slices x")
    outcomes.refuse(KEY, "foreign slices x, y")
    assert reasons(events) == ["ResourceSlicePoolConflict"] * 2
    assert outcomes.refused() == {KEY}
    outcomes.failed(KEY, "failed", "boom", 1)
    assert outcomes.refused() == set()
    assert outcomes.failing() == {KEY: "boom"}


def test_dropped_fields_are_reported_with_their_likely_gate() -> None:
    events = Recorder()
    outcomes = PoolOutcomes(events)
    outcomes.dropped(KEY, {})
    assert events.warned == []
    outcomes.dropped(KEY, {"devices[].taints": "DRADeviceTaints", "x": ""})
    [(reason, message)] = events.warned
    assert reason == "ResourceSliceFieldsDropped"
    assert "devices[].taints (feature gate DRADeviceTaints), x (feature gate unknown)" in message


def test_the_gauges_show_lasting_refusals() -> None:
    outcomes = PoolOutcomes(None)  # no recorder: reported by log and metric only
    outcomes.refuse(KEY, "foreign")
    outcomes.refused_by_server(
        ("other", "pool"), Invalid(422, "Invalid", "no"), None, now=0.0, retry=1.0
    )
    outcomes.show()
    assert metrics.REFUSED_POOLS._value.get() == 1
    assert metrics.INVALID_POOLS._value.get() == 1
