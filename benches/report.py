"""What the bench modules share: the side-by-side summary printed after a module's last benchmark,
a client of the bench's own apiserver, and percentiles."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

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


def client_for(srv: ApiServer, identity: str) -> KubeClient:
    """A client of the bench's apiserver without the agent's client-side throttling in the way."""
    return KubeClient(load_kubeconfig(str(srv.kubeconfig(identity))), qps=1000.0, burst=2000)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
