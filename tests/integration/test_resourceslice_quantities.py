"""Quantities round-tripped through a real kube-apiserver: every quantity the agent accepts is
sent in the form the server stores (the same text back), so the planner finds nothing to update
afterwards. Issue 20: `1000E` was sent as is and stored as `1` (another value: a rewrite on every
pass); it is now sent as `1e21`.

Dry-run creates (`?dryRun=All`) answer with the object as it would be stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nodeagent import _native
from nodeagent.resources.model import (
    Counter,
    CounterSet,
    Device,
    DeviceCapacity,
    Pool,
    desired_slices,
)
from tests.support.apiserver import ApiServer, newest_release, start_apiserver
from tests.support.quantity import QuantityError, canonicalize

pytestmark = pytest.mark.integration

PATH = "/apis/resource.k8s.io/v1/resourceslices?dryRun=All"
SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    # The newest release: quantities are not behind any gate.
    srv = start_apiserver(tmp_path_factory.mktemp("quantities"), release=newest_release())
    try:
        yield srv
    finally:
        srv.close()


@st.composite
def quantity_texts(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "", "-", "+"]))
    whole = draw(st.sampled_from(["0", "1", "5", "10", "999", "1000", "1024", "1500", "2000"]))
    whole = draw(st.one_of(st.just(whole), st.integers(0, 10**22).map(str)))
    fraction = draw(st.sampled_from(["", "", ".5", ".001", ".0000000001", ".123456789"]))
    if draw(st.booleans()):
        suffix = draw(st.sampled_from(SUFFIXES))
    else:
        suffix = draw(st.sampled_from(["e", "E"])) + str(draw(st.integers(-30, 30)))
    return f"{sign}{whole}{fraction}{suffix}"


def accepted(texts: list[str]) -> list[str]:
    out = []
    for t in texts:
        try:
            canonicalize(t)
        except QuantityError:
            continue
        out.append(t)
    return out


def round_trip(server: ApiServer, pool: Pool) -> list[tuple[bytes, dict[str, Any]]]:
    """Each desired spec with the object the server would store for it."""
    out = []
    for i, spec in enumerate(desired_slices("q.example.com", pool, "node-a")):
        raw = msgspec.to_builtins(spec)
        raw["pool"]["generation"] = 1
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"q-{i}"},
            "spec": raw,
        }
        status, stored = server.request("POST", PATH, body)
        assert status == 201, stored
        out.append((msgspec.json.encode(spec), stored))
    return out


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(texts=st.lists(quantity_texts(), min_size=1, max_size=32))
@example(texts=["1000E", "2000E", "1e21", "1.5e21", "1500E", "999E", "8Ei", "1024Ei"])
@example(texts=["1e-2147483648", "1e-30", "0.0000000001", "-1e-10", "1e28", "12345678901234567890"])
def test_quantities_are_sent_as_the_server_stores_them(server: ApiServer, texts: list[str]) -> None:
    ok = accepted(texts)
    if not ok:
        return
    pool = Pool(
        name="p",
        devices=[
            Device(name="d", capacity={f"c{i}": DeviceCapacity(value=t) for i, t in enumerate(ok)})
        ],
        shared_counters=[
            CounterSet(name="s", counters={f"c{i}": Counter(value=t) for i, t in enumerate(ok)})
        ],
    )
    pairs = round_trip(server, pool)
    for sent, stored in pairs:
        spec = msgspec.json.decode(sent)
        if "devices" in spec:
            got = {k: v["value"] for k, v in stored["spec"]["devices"][0]["capacity"].items()}
            want = {k: v["value"] for k, v in spec["devices"][0]["capacity"].items()}
        else:
            got = {
                k: v["value"] for k, v in stored["spec"]["sharedCounters"][0]["counters"].items()
            }
            want = {k: v["value"] for k, v in spec["sharedCounters"][0]["counters"].items()}
        # The same text back: nothing for the planner to see, nothing for a reader to wonder at.
        assert got == want, {
            k: (want[k], got[k], ok[int(k[1:])]) for k in want if got[k] != want[k]
        }
    # And the planner, given what was stored, plans nothing.
    plan = _native.plan_pool(
        [sent for sent, _ in pairs], [msgspec.json.encode(stored) for _, stored in pairs]
    )
    assert (plan.updates, plan.creates, plan.deletes) == ([], [], [])
