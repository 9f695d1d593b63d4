"""ResourceSlice planning: the Rust planner (`_native.plan_pool`, canonical hashing, O(n))
against a plain Python implementation of the seed kubelet's algorithm (for each observed slice,
scan the desired models with semantic deep-equality, O(n*m)).

- realistic node: 8 drivers x 1,024 devices (8 pools x 8 slices = 64 slices), one device
  changed and nothing changed;
- stress: one pool of 100 and 1,000 slices of 128 devices observed vs desired, 1% and 0% of the
  slices changed.

The Rust figure includes decoding every desired and observed slice from JSON bytes (the form the
store holds them in); the Python seed baseline gets pre-decoded dicts, so it is favoured. With a
Go toolchain present, the seed algorithm also runs in Go (benches/goseed: encoding/json into the
k8s.io/api resource/v1 types from the same bytes, then apiequality.Semantic.DeepEqual), built
once into the nodeagent cache by benches/goseed/build.sh; its figure is the best of 3 runs.

Run: .venv/bin/python -m pytest benches/bench_planner.py --benchmark-only -s
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from benches.bench_accumulator import jsonscan
from nodeagent import _native
from nodeagent.resources.model import (
    Device,
    DeviceAttribute,
    DeviceCapacity,
    Pool,
    desired_slices,
)
from tests.support.planner_reference import spec_equal

RESULTS: dict[str, float] = {}


def device(pool: int, k: int, changed: bool = False) -> Device:
    return Device(
        name=f"dev-{k}",
        attributes={
            "model": DeviceAttribute(string="changed" if changed else "accelerator-x100"),
            "index": DeviceAttribute(int_=k),
            "uuid": DeviceAttribute(string=f"{pool:04x}-{k:08x}-6f1e-4e0a-9d1c"),
            "driverVersion": DeviceAttribute(version="1.4.2"),
        },
        capacity={"memory": DeviceCapacity(value="80Gi"), "cores": DeviceCapacity(value="128")},
    )


class Case:
    """Per pool: desired spec bytes and dicts, observed slice bytes and dicts."""

    def __init__(self, pools: int, devices: int, changed_slices: int) -> None:
        self.pools: list[tuple[list[bytes], list[bytes], list[Any], list[Any]]] = []
        for p in range(pools):
            pool = Pool(name=f"pool-{p}", devices=[device(p, k) for k in range(devices)])
            specs = desired_slices(f"drv{p}.example.com", pool, "node-a")
            observed = []
            for i, s in enumerate(specs):
                raw = msgspec.to_builtins(s)
                raw["pool"]["generation"] = 1
                # What the server returns: quantities in their canonical form already, but
                # respell one per device to make the comparison semantic, not textual.
                for d in raw["devices"]:
                    d["capacity"]["memory"]["value"] = "85899345920"
                if i < changed_slices:
                    raw["devices"][0]["attributes"]["model"]["string"] = "old"
                observed.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {
                            "name": f"node-a-drv{p}-{i:05x}",
                            "uid": f"uid-{p}-{i}",
                            "resourceVersion": str(1000 + i),
                            "generation": 1,
                        },
                        "spec": raw,
                    }
                )
            # Generated names put the observed slices in random order relative to the desired
            # ones, as an informer lists them.
            random.Random(p).shuffle(observed)
            desired = [msgspec.json.encode(s) for s in specs]
            self.pools.append(
                (
                    desired,
                    [json.dumps(o).encode() for o in observed],
                    [msgspec.json.decode(d) for d in desired],
                    observed,
                )
            )
        self.slices = sum(len(p[0]) for p in self.pools)
        self.prepared = [
            (_native.prepare_desired(d), _native.prepare_observed(o)) for d, o, _, _ in self.pools
        ]


def rust_plan(case: Case) -> list[Any]:
    """Cold: every slice decoded and canonicalized from bytes, then planned."""
    return [_native.plan_pool(d, o) for d, o, _, _ in case.pools]


def rust_plan_prepared(case: Case) -> list[Any]:
    """Steady state: the publisher keeps each slice prepared (canonicalized once per
    resourceVersion or desired inventory), so a sync only matches and plans."""
    return [_native.plan_prepared(d, o) for d, o in case.prepared]


def seed_plan(case: Case) -> list[Any]:
    """The seed kubelet's sync per driver: an observed slice whose content is semantically equal
    to a desired model marks that model stored; every other slice is obsolete."""
    out = []
    for _, _, desired, observed in case.pools:
        stored = [False] * len(desired)
        obsolete = []
        for o in observed:
            for i, d in enumerate(desired):
                if not stored[i] and spec_equal(d, o["spec"]):
                    stored[i] = True
                    break
            else:
                obsolete.append(o)
        out.append((obsolete, [i for i, s in enumerate(stored) if not s]))
    return out


GOSEED = Path(__file__).parent / "goseed"


def go_available() -> bool:
    return bool(shutil.which("go") or os.path.exists("/usr/local/go/bin/go"))


def case_file(case: Case) -> bytes:
    """The pools' bytes in benches/goseed's case format (also read by benches/jsonscan)."""
    out = [struct.pack("<I", len(case.pools))]
    for desired, observed, _, _ in case.pools:
        out.append(struct.pack("<II", len(desired), len(observed)))
        for b in (*desired, *observed):
            out += [struct.pack("<I", len(b)), b]
    return b"".join(out)


def go_seed(case: Case) -> tuple[float, float]:
    """Seconds per plan of every pool by the Go seed (benches/goseed), on the same bytes, and
    of its decoding alone."""
    build = subprocess.run(
        ["bash", str(GOSEED / "build.sh")], check=True, capture_output=True, text=True
    )
    binary = build.stdout.strip().splitlines()[-1]
    with tempfile.NamedTemporaryFile(suffix=".goseed") as f:
        f.write(case_file(case))
        f.flush()
        res = subprocess.run([binary, f.name, "3"], check=True, capture_output=True, text=True)
    m = re.search(r" ns/op=(\d+) decode-ns/op=(\d+)", res.stdout)
    assert m, res.stdout
    return int(m.group(1)) / 1e9, int(m.group(2)) / 1e9


# Seconds of each round, wall and CPU, by the bench's own clock: `benchmark.stats` is None under
# --benchmark-disable (a run that only checks the benches work), these are always there.
WALL: dict[str, list[float]] = {}
CPU: dict[str, list[float]] = {}


def timed(name: str, fn: Callable[[Case], Any], case: Case) -> Any:
    t, w = time.process_time(), time.perf_counter()
    r = fn(case)
    WALL.setdefault(name, []).append(time.perf_counter() - w)
    CPU.setdefault(name, []).append(time.process_time() - t)
    return r


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print("\n" + text)


CASES = {
    "realistic-1-device-changed": (8, 1024, 1),
    "realistic-unchanged": (8, 1024, 0),
    "stress-100-1pct": (1, 100 * 128, 1),
    "stress-100-0pct": (1, 100 * 128, 0),
    "stress-1000-1pct": (1, 1000 * 128, 10),
    "stress-1000-0pct": (1, 1000 * 128, 0),
}
_built: dict[str, Case] = {}


def case_for(name: str) -> Case:
    if name not in _built:
        _built.clear()
        _built[name] = Case(*CASES[name])
    return _built[name]


@pytest.mark.parametrize("name", ["stress-1000-0pct"])
def test_scanner_vs_simd_crates(
    benchmark: Any, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The cold plan's decoding: the project's scanner writing the canonical form against the
    SIMD crates only parsing into their trees (benches/jsonscan)."""
    case = case_for(name)
    out: list[dict[str, float] | None] = []
    benchmark.pedantic(lambda: out.append(jsonscan("slices", case_file(case))), rounds=1)
    if out[0] is None:
        report(capsys, "scanner: no cargo, no comparison with the SIMD crates")
        return
    for impl, secs in out[0].items():
        benchmark.extra_info[f"{impl}_ms"] = round(secs * 1e3, 2)
        what = "validate + canonical form" if impl == "own" else "parse into its tree only"
        report(capsys, f"slices {name} ({case.slices} x 2), {impl}: {secs * 1e3:,.2f} ms ({what})")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("impl", ["seed-python", "seed-go", "rust-cold", "rust-prepared"])
def test_plan(benchmark: Any, capsys: pytest.CaptureFixture[str], name: str, impl: str) -> None:
    case = case_for(name)
    benchmark.group = f"plan {name}"
    if impl == "seed-go":
        if not go_available():
            report(capsys, f"plan {name}: no Go toolchain, no Go seed figure")
            return
        secs: list[tuple[float, float]] = []
        benchmark.pedantic(lambda: secs.append(go_seed(case)), rounds=1, iterations=1)
        total, decode = secs[0]
        RESULTS[f"seed-go-{name}"] = total
        benchmark.extra_info.update(
            go_seed_ms=round(total * 1e3, 2), go_decode_ms=round(decode * 1e3, 2)
        )
        report(
            capsys,
            f"plan {name} ({case.slices} slices), seed-go (best of 3): {total * 1e3:,.2f} ms "
            f"(decoding {decode * 1e3:,.2f} ms of it)",
        )
        return
    fn = {"rust-cold": rust_plan, "rust-prepared": rust_plan_prepared}.get(impl, seed_plan)
    rounds = 1 if impl == "seed-python" else 5
    benchmark.pedantic(timed, args=(f"{impl}-{name}", fn, case), rounds=rounds, iterations=1)
    best = min(WALL[f"{impl}-{name}"])
    cpu = min(CPU[f"{impl}-{name}"])
    RESULTS[f"{impl}-{name}"] = best
    text = (
        f"plan {name} ({case.slices} slices), {impl}: "
        f"{best * 1e3:,.2f} ms wall, {cpu * 1e3:,.2f} ms CPU"
    )
    seed = RESULTS.get(f"seed-python-{name}")
    if impl != "seed-python" and seed:
        benchmark.extra_info["ratio_vs_seed"] = round(seed / best, 1)
        text += f"; {seed / best:,.1f}x faster than the seed algorithm"
    go = RESULTS.get(f"seed-go-{name}")
    if impl.startswith("rust") and go:
        benchmark.extra_info["ratio_vs_go_seed"] = round(go / best, 1)
        text += f"; {go / best:,.1f}x faster than the Go seed"
    report(capsys, text)
