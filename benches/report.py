"""What the bench modules share: the side-by-side summary printed after a module's last benchmark,
a client of the bench's own apiserver, percentiles, the wall time of a bench's rounds, and the
latency figures of a run (loop lag, probe latency) with their report lines."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Generic, ParamSpec, TypeVar

import pytest

from nodeagent.kube import KubeClient, load_kubeconfig
from tests.support.apiserver import ApiServer


def print_uncaptured(
    request: pytest.FixtureRequest, report: Callable[[Callable[[str], None]], None]
) -> None:
    """Run `report(print)` with pytest's output capture off, so the ratios show without `-s`."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        report(print)


P = ParamSpec("P")
R = TypeVar("R")


class Rounds(Generic[P, R]):
    """A bench's function that keeps each call's wall seconds, to pass to `benchmark` and read
    after it: `benchmark.stats` is None under --benchmark-disable (a run that only checks the
    benches work: one call each), these are always there. Warm-up calls are kept too (`last`)."""

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn = fn
        self.seconds: list[float] = []

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        t = time.perf_counter()
        result = self.fn(*args, **kwargs)
        self.seconds.append(time.perf_counter() - t)
        return result

    def last(self, rounds: int) -> list[float]:
        """The wall seconds of the last `rounds` calls (fewer when disabled)."""
        return self.seconds[-rounds:]


def client_for(srv: ApiServer, identity: str) -> KubeClient:
    """A client of the bench's apiserver without the agent's client-side throttling in the way."""
    return KubeClient(load_kubeconfig(str(srv.kubeconfig(identity))), qps=1000.0, burst=2000)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latencies(values: list[float]) -> dict[str, float]:
    """The figures of a run's latencies (seconds): p50, p99 and max in ms, and the sample count."""
    return {
        "p50_ms": statistics.median(values) * 1e3,
        "p99_ms": percentile(values, 0.99) * 1e3,
        "max_ms": max(values) * 1e3,
        "samples": float(len(values)),
    }


def latency_line(name: str, r: Mapping[str, float], more: str) -> str:
    """One variant's line of `latencies` figures; `more` in parentheses after them."""
    return (
        f"  {name:<8}: p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  max "
        f"{r['max_ms']:7.1f} ms  ({more})"
    )


def ratio_line(base: Mapping[str, float], ours: Mapping[str, float], target: str) -> str:
    """How much lower our p99 and max are than the baseline's, and the target."""
    return (
        f"  ratio baseline/ours: p99 {base['p99_ms'] / ours['p99_ms']:.1f}x, max "
        f"{base['max_ms'] / ours['max_ms']:.1f}x (target: {target})"
    )
