"""Decoding Kubernetes JSON: msgspec view structs (what nodeagent does) against `json.loads`
into dicts (what dict-based clients do), side by side.

- a 10,000-object ConfigMap List (~1 KB each, with managedFields and annotations);
- a 100,000-event watch stream (newline-delimited), decoded line by line.

Run: .venv/bin/python -m pytest benches/bench_decode.py --benchmark-only
The objects/s of each and the speed-up ratio are printed at the end of the run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from benches.report import Rounds, print_uncaptured
from nodeagent.kube.models import ConfigMap, ListMeta

LIST_OBJECTS = 10_000
WATCH_EVENTS = 100_000
ROUNDS = 3


def _configmap(i: int, rv: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"agent-config-{i:05d}",
            "namespace": f"team-{i % 37}",
            "uid": f"6f1c2d3e-{i:04x}-4b5a-9c8d-7e6f5a4b3c2d",
            "resourceVersion": str(rv),
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "labels": {"app.kubernetes.io/name": "nodeagent", "tier": "node", "shard": str(i % 8)},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {"apiVersion": "v1", "kind": "ConfigMap", "data": {"mode": "on"}}
                ),
            },
            "managedFields": [
                {
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-01-02T03:04:05Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:data": {".": {}, "f:mode": {}, "f:level": {}, "f:targets": {}},
                        "f:metadata": {
                            "f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied": {}},
                            "f:labels": {".": {}, "f:app.kubernetes.io/name": {}, "f:tier": {}},
                        },
                    },
                },
            ],
        },
        "data": {
            "mode": "on",
            "level": str(i % 5),
            "targets": ",".join(f"n{j}" for j in range(12)),
        },
    }


class ConfigMapList(msgspec.Struct):
    metadata: ListMeta
    items: list[ConfigMap]


class ConfigMapEvent(msgspec.Struct):
    type: str
    object: ConfigMap


@pytest.fixture(scope="module")
def list_body() -> bytes:
    items = [_configmap(i, 1000 + i) for i in range(LIST_OBJECTS)]
    return json.dumps(
        {"kind": "ConfigMapList", "metadata": {"resourceVersion": "99"}, "items": items}
    ).encode()


@pytest.fixture(scope="module")
def watch_lines() -> list[bytes]:
    return [
        json.dumps({"type": "MODIFIED", "object": _configmap(i % 5000, 20_000 + i)}).encode()
        for i in range(WATCH_EVENTS)
    ]


results: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, _print_ratios)


def _print_ratios(write: Callable[[str], None]) -> None:
    write("")
    for group, n in (("list", LIST_OBJECTS), ("watch", WATCH_EVENTS)):
        fast, slow = results.get(f"{group}-msgspec"), results.get(f"{group}-json")
        if fast and slow:
            write(
                f"decode {group}: msgspec view {n / fast:,.0f} objects/s, json.loads "
                f"{n / slow:,.0f} objects/s, ratio {slow / fast:.1f}x"
            )
    raw, slow = results.get("watch-raw"), results.get("watch-json")
    if raw and slow:
        write(
            f"decode watch: raw object + metadata head {WATCH_EVENTS / raw:,.0f} events/s, "
            f"ratio {slow / raw:.1f}x over json.loads"
        )


def _bench(benchmark: Any, key: str, fn: Callable[[], object]) -> None:
    calls = Rounds(fn)
    benchmark.pedantic(calls, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    results[key] = statistics.mean(calls.last(ROUNDS))  # not the warm-up round


@pytest.mark.benchmark(group="decode-list-10k")
def test_list_msgspec_view(benchmark: Any, list_body: bytes) -> None:
    decoder = msgspec.json.Decoder(ConfigMapList)
    decoded = decoder.decode(list_body)
    assert len(decoded.items) == LIST_OBJECTS and decoded.items[3].data["level"] == "3"
    _bench(benchmark, "list-msgspec", lambda: decoder.decode(list_body))


@pytest.mark.benchmark(group="decode-list-10k")
def test_list_json_loads(benchmark: Any, list_body: bytes) -> None:
    assert len(json.loads(list_body)["items"]) == LIST_OBJECTS
    _bench(benchmark, "list-json", lambda: json.loads(list_body))


@pytest.mark.benchmark(group="decode-watch-100k")
def test_watch_msgspec_view(benchmark: Any, watch_lines: list[bytes]) -> None:
    decode = msgspec.json.Decoder(ConfigMapEvent).decode
    assert decode(watch_lines[7]).object.metadata.resource_version == "20007"
    _bench(benchmark, "watch-msgspec", lambda: [decode(line) for line in watch_lines])


@pytest.mark.benchmark(group="decode-watch-100k")
def test_watch_json_loads(benchmark: Any, watch_lines: list[bytes]) -> None:
    loads = json.loads
    _bench(benchmark, "watch-json", lambda: [loads(line) for line in watch_lines])


@pytest.mark.benchmark(group="decode-watch-100k")
def test_watch_raw_event_and_head(benchmark: Any, watch_lines: list[bytes]) -> None:
    """What the plain-Python sink does: keep the object bytes, decode only kind/metadata."""
    from nodeagent.kube.models import ObjectHead, WatchEvent

    event = msgspec.json.Decoder(WatchEvent).decode
    head = msgspec.json.Decoder(ObjectHead).decode

    def run() -> list[str]:
        return [head(event(line).object).metadata.resource_version for line in watch_lines]

    assert run()[7] == "20007"
    _bench(benchmark, "watch-raw", run)
