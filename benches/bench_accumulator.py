"""The accumulator's hot paths against plain-Python baselines, side by side in one run.

- ingest: watch events of ~1 KB (realistic metadata incl. managedFields; mixed add, update and
  delete over 100,000 keys) fed as raw 32 KiB chunks: the Rust store against the Python
  reference store (json.loads + dicts, tests/support/store_reference.py). The Rust store
  takes all EVENTS events; the reference, which is much slower, a BASELINE_EVENTS prefix of the
  same stream; rates are compared per event.
- snapshot: N stored objects, 1% (and a fixed 1,000) changed: time for the next snapshot and
  its deltas (drain + decode of the changed objects + copy-on-write view), at 10k and 100k
  stored, against rebuilding the snapshot from every object (what kates does on each update).
- scanner: the project's JSON scanner (rust/src/json.rs and the store's event parser, compiled
  into benches/jsonscan) against the SIMD crates sonic-rs and simd-json doing the same per-event
  work on the same stream (validate, read type and metadata, find the object's span); needs
  cargo (the build is cached in the nodeagent cache).
- memory: resident memory of 100,000 stored ~1 KB objects, in a fresh process, against the raw
  object bytes; plus the store's own byte count.

Run: .venv/bin/python -m pytest benches/bench_accumulator.py --benchmark-only -s
(ACC_BENCH_EVENTS=200000 for a quicker run.)
"""

from __future__ import annotations

import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from benches.report import Rounds
from nodeagent._native import Store
from nodeagent.accumulator.model import Query
from nodeagent.accumulator.view import QueryView
from nodeagent.kube.models import ConfigMap
from tests.support.store_reference import RefStore

EVENTS = int(os.environ.get("ACC_BENCH_EVENTS", "1000000"))
BASELINE_EVENTS = min(EVENTS, 100_000)
KEYS = 100_000
CHUNK = 32 * 1024
RESULTS: dict[str, float] = {}

_OBJ = (
    '{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%(k)06d",'
    '"namespace":"team-%(ns)02d","uid":"%(k)08x-6f1c-4b2e-9d7a-%(k)012x",'
    '"resourceVersion":"%(rv)d","creationTimestamp":"2026-11-01T10:00:00Z",'
    '"labels":{"app.kubernetes.io/name":"svc-%(app)d","app.kubernetes.io/part-of":"shop",'
    '"tier":"backend"},"annotations":{"nodeagent.io/checksum":"sha256:%(k)064x"},'
    '"managedFields":[{"manager":"kubectl-client-side-apply","operation":"Update",'
    '"apiVersion":"v1","time":"2026-11-01T10:00:00Z","fieldsType":"FieldsV1",'
    '"fieldsV1":{"f:data":{".":{},"f:config.yaml":{},"f:revision":{}},'
    '"f:metadata":{"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:tier":{}}}}}]},'
    '"data":{"config.yaml":"%(pad)s","revision":"%(rv)d"}}'
)
_PAD = "listen: 0.0.0.0:8080\\nlog_level: info\\nfeatures: [a, b, c]\\n" * 6


def make_object(k: int, rv: int) -> bytes:
    return (_OBJ % {"k": k, "ns": k % 40, "app": k % 97, "rv": rv, "pad": _PAD}).encode()


@cache
def stream() -> tuple[list[bytes], list[bytes], int]:
    """(chunks of all events, chunks of the baseline prefix, total bytes); built once."""
    rng = random.Random(42)
    live: set[int] = set()
    lines = []
    for i in range(EVENTS):
        k = rng.randrange(KEYS)
        if k not in live:
            ty = "ADDED"
            live.add(k)
        elif rng.random() < 0.15:
            ty = "DELETED"
            live.discard(k)
        else:
            ty = "MODIFIED"
        lines.append(b'{"type":"%s","object":%s}\n' % (ty.encode(), make_object(k, 1000 + i)))
    data = b"".join(lines)
    prefix = b"".join(lines[:BASELINE_EVENTS])
    del lines

    def chunks(b: bytes) -> list[bytes]:
        return [b[i : i + CHUNK] for i in range(0, len(b), CHUNK)]

    return chunks(data), chunks(prefix), len(data)


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print("\n" + text)


CPU: dict[str, list[float]] = {}


def feed_all(name: str, factory: Callable[[], Any], chunks: list[bytes]) -> Any:
    """Feeds every chunk to a new store; also records the CPU time it took, because the bench
    machine is shared and wall time includes waiting for a core."""
    s = factory()
    t = time.process_time()
    for c in chunks:
        s.feed(c)
    CPU.setdefault(name, []).append(time.process_time() - t)
    return s


@pytest.mark.benchmark(group="ingest")
def test_ingest_python_reference(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, prefix, _ = stream()
    feed = Rounds(feed_all)
    benchmark.pedantic(feed, args=("ref", RefStore, prefix), rounds=2, iterations=1)
    rate = BASELINE_EVENTS / min(feed.seconds)
    cpu_rate = BASELINE_EVENTS / min(CPU["ref"])
    RESULTS["ingest_ref"], RESULTS["ingest_ref_cpu"] = rate, cpu_rate
    benchmark.extra_info.update(events_per_s=round(rate), events_per_cpu_s=round(cpu_rate))
    report(
        capsys,
        f"ingest, Python reference: {rate:,.0f} events/s wall, {cpu_rate:,.0f} per CPU-second "
        f"({BASELINE_EVENTS:,} events)",
    )


@pytest.mark.benchmark(group="ingest")
def test_ingest_rust_store(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    chunks, _, total = stream()
    feed = Rounds(feed_all)
    benchmark.pedantic(feed, args=("rust", Store, chunks), rounds=3, iterations=1)
    best = min(feed.seconds)
    rate = EVENTS / best
    cpu_rate = EVENTS / min(CPU["rust"])
    benchmark.extra_info.update(events_per_s=round(rate), events_per_cpu_s=round(cpu_rate))
    text = (
        f"ingest, Rust store: {rate:,.0f} events/s wall, {cpu_rate:,.0f} per CPU-second, "
        f"{total / best / 1e6:,.0f} MB/s wall ({EVENTS:,} events, {total / EVENTS:,.0f} B/event, "
        "one thread)"
    )
    ref, ref_cpu = RESULTS.get("ingest_ref"), RESULTS.get("ingest_ref_cpu")
    if ref and ref_cpu:
        benchmark.extra_info["ratio_vs_reference"] = round(rate / ref, 1)
        text += f"; {rate / ref:.1f}x the Python reference (CPU: {cpu_rate / ref_cpu:.1f}x)"
    report(capsys, text)


JSONSCAN = Path(__file__).parent / "jsonscan"


def jsonscan(mode: str, data: bytes) -> dict[str, float] | None:
    """Seconds per scanner (the project's "own", "sonic-rs", ...) of benches/jsonscan on `data`
    (best of 3), or None without cargo."""
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.path.exists(cargo):
        return None
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    target = os.path.join(cache, "nodeagent", "cargo-target-jsonscan")
    subprocess.run(
        [
            cargo,
            "build",
            "--release",
            "--locked",
            "-q",
            "--manifest-path",
            str(JSONSCAN / "Cargo.toml"),
        ],
        check=True,
        env={**os.environ, "CARGO_TARGET_DIR": target},
    )
    with tempfile.NamedTemporaryFile(suffix=".jsonscan") as f:
        f.write(data)
        f.flush()
        res = subprocess.run(
            [os.path.join(target, "release", "jsonscan"), mode, f.name, "3"],
            check=True,
            capture_output=True,
            text=True,
        )
    return {m[1]: int(m[2]) / 1e9 for m in re.finditer(r"^(\S+) ns=(\d+)", res.stdout, re.M)}


@pytest.mark.benchmark(group="scanner")
def test_scanner_vs_simd_crates(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    chunks, _, total = stream()
    out: list[dict[str, float] | None] = []
    benchmark.pedantic(lambda: out.append(jsonscan("events", b"".join(chunks))), rounds=1)
    if out[0] is None:
        report(capsys, "scanner: no cargo, no comparison with the SIMD crates")
        return
    own = out[0]["own"]
    for name, secs in out[0].items():
        benchmark.extra_info[f"{name}_events_per_s"] = round(EVENTS / secs)
        text = (
            f"scanner {name}: {EVENTS / secs:,.0f} events/s, {total / secs / 1e6:,.0f} MB/s "
            "(scan only, no store)"
        )
        if name != "own":
            text += f"; the project's scanner is {secs / own:.2f}x as fast"
        report(capsys, text)


def stored_view(n: int) -> tuple[QueryView, int]:
    view = QueryView(Query("cms", "v1", "ConfigMap", into=ConfigMap))
    view.store.feed(
        b"".join(b'{"type":"ADDED","object":%s}\n' % make_object(k, 10 + k) for k in range(n))
    )
    view.drain()
    return view, 10 + n


def changes(n: int, count: int, rv: int, rng: random.Random) -> bytes:
    keys = rng.sample(range(n), count)
    return b"".join(
        b'{"type":"MODIFIED","object":%s}\n' % make_object(k, rv + i) for i, k in enumerate(keys)
    )


SNAPSHOT_CASES = [(10_000, 100), (100_000, 1_000), (10_000, 1_000)]


@pytest.mark.benchmark(group="snapshot")
@pytest.mark.parametrize(("stored", "changed"), SNAPSHOT_CASES)
def test_snapshot_incremental(
    benchmark: Any, capsys: pytest.CaptureFixture[str], stored: int, changed: int
) -> None:
    view, rv = stored_view(stored)
    rng = random.Random(7)
    state = {"rv": rv}

    def setup() -> tuple[tuple[()], dict[str, Any]]:
        view.store.feed(changes(stored, changed, state["rv"], rng))
        state["rv"] += changed
        return (), {}

    def run() -> None:
        deltas = view.drain()
        assert len(deltas) == changed

    drain = Rounds(run)
    benchmark.pedantic(drain, setup=setup, rounds=20, iterations=1)
    t = statistics.median(drain.seconds)
    RESULTS[f"snap_{stored}_{changed}"] = t
    benchmark.extra_info["ms"] = round(t * 1000, 2)
    report(
        capsys,
        f"snapshot, {stored:,} stored, {changed:,} changed: {t * 1000:.2f} ms "
        f"({t / changed * 1e6:.1f} us per changed object)",
    )


@pytest.mark.benchmark(group="snapshot")
@pytest.mark.parametrize("stored", [10_000, 100_000])
def test_snapshot_full_rebuild_baseline(
    benchmark: Any, capsys: pytest.CaptureFixture[str], stored: int
) -> None:
    raws = [make_object(k, 10 + k) for k in range(stored)]
    decoder = msgspec.json.Decoder(ConfigMap)

    def rebuild() -> None:
        objs = {}
        for raw in raws:
            cm = decoder.decode(raw)
            objs[(cm.metadata.namespace, cm.metadata.name)] = cm
        [objs[k] for k in sorted(objs)]

    rebuilds = Rounds(rebuild)
    benchmark.pedantic(rebuilds, rounds=3, iterations=1)
    t = statistics.median(rebuilds.seconds)
    changed = stored // 100
    text = f"snapshot baseline (re-decode everything), {stored:,} stored: {t * 1000:.1f} ms"
    inc = RESULTS.get(f"snap_{stored}_{changed}")
    if inc:
        benchmark.extra_info["ratio_vs_incremental"] = round(t / inc, 1)
        text += f"; incremental with 1% changed is {t / inc:.0f}x faster"
    report(capsys, text)


_MEMORY_SCRIPT = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
from benches.bench_accumulator import make_object
from nodeagent._native import Store

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

n = 100_000
raw = 0
chunks = []
# Built without a big temporary list: freed memory would be reused by the store and hide
# part of its footprint from the RSS delta.
for i in range(0, n, 1000):
    objs = [make_object(k, 10 + k) for k in range(i, i + 1000)]
    raw += sum(len(o) for o in objs)
    chunks.append(b"".join(b'{"type":"ADDED","object":%s}\n' % o for o in objs))
del objs
gc.collect()
before = rss()
s = Store()
for c in chunks:
    s.feed(c)
after = rss()
print(raw, after - before, s.memory_usage(), len(s))
"""


@pytest.mark.benchmark(group="memory")
def test_memory_100k_objects(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out: list[int] = []

    def measure() -> None:
        res = subprocess.run(
            [sys.executable, "-c", _MEMORY_SCRIPT, root], check=True, capture_output=True
        )
        out[:] = [int(x) for x in res.stdout.split()]

    benchmark.pedantic(measure, rounds=1, iterations=1)
    raw, rss, own, count = out
    assert count == 100_000
    benchmark.extra_info.update({"raw_bytes": raw, "rss_delta": rss, "store_bytes": own})
    report(
        capsys,
        f"memory, 100,000 objects of {raw / count:,.0f} B: raw {raw / 2**20:.1f} MiB, "
        f"RSS delta {rss / 2**20:.1f} MiB ({rss / raw:.2f}x raw), "
        f"store's own count {own / 2**20:.1f} MiB ({own / raw:.2f}x raw)",
    )
