"""scripts/docs_charts.py: the performance page's charts from pytest-benchmark's saved JSON."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.docs import DOCS, REPO_ROOT


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_charts", REPO_ROOT / "scripts" / "docs_charts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


charts = load_script()


def run(*benches: tuple[str, str, float], dirty: bool = False) -> dict[str, Any]:
    return {
        "datetime": "2026-11-26T08:09:16.154223+00:00",
        "machine_info": {"cpu": {"brand_raw": "AMD EPYC", "count": 2}, "python_version": "3.11.7"},
        "commit_info": {"id": "79999dfe75a6b9c3d1053f78f75a4d77486aa0bb", "dirty": dirty},
        "benchmarks": [
            {"group": group, "name": name, "param": None, "stats": {"median": median}}
            for group, name, median in benches
        ],
    }


def bars(svg: str) -> list[tuple[str, float, str]]:
    """(label, bar length, value text) in drawing order."""
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', svg)
    lengths = [float(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="([\d.]+)"', svg)]
    values = re.findall(r'<text x="[\d.]+" y="\d+">([^<]*)</text>', svg)
    return list(zip(labels, lengths, values, strict=True))


def test_one_chart_per_group_fastest_first_with_ratios(tmp_path: Path) -> None:
    path = tmp_path / "bench_x.json"
    path.write_text(
        json.dumps(
            run(
                ("decode", "test_json_loads", 0.3),
                ("decode", "test_msgspec", 0.1),
                ("plan x", "test_other", 2e-3),
            )
        )
    )
    out = charts.charts(path)
    assert sorted(out) == ["bench_x--decode.svg", "bench_x--plan-x.svg"]
    (fast, fast_len, fast_text), (slow, slow_len, slow_text) = bars(out["bench_x--decode.svg"])
    assert (fast, slow) == ("msgspec", "json_loads")
    assert fast_text == "100 ms" and slow_text == "300 ms  (3\u00d7)"
    assert slow_len == pytest.approx(3 * fast_len, abs=0.5)  # linear below 100x
    assert "2026-11-26 08:09 UTC" in out["bench_x--decode.svg"]
    assert "commit 79999dfe7</text>" in out["bench_x--decode.svg"]


def test_a_wide_range_is_drawn_on_a_log_scale_and_a_dirty_tree_is_said() -> None:
    svg = charts.chart(
        run(("g", "test_rust", 1e-4), ("g", "test_python", 1.0), dirty=True), "g", "title"
    )
    (_, fast_len, fast_text), (_, slow_len, slow_text) = bars(svg)
    assert fast_text == "100 \u00b5s" and slow_text == "1 s  (10,000\u00d7)"
    assert fast_len > 0.15 * slow_len  # visible: log10(10) of log10(100,000)
    assert "bars on a log scale" in svg
    assert "+ uncommitted changes" in svg


def test_an_empty_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="no benchmark in group"):
        charts.chart(run(("g", "test_a", 1.0)), "other", "title")


def test_every_saved_run_draws_and_the_page_shows_its_charts() -> None:
    data = sorted((DOCS / "performance" / "data").glob("*.json"))
    assert data
    page = (DOCS / "performance" / "index.md").read_text(encoding="utf-8")
    for path in data:
        drawn = charts.charts(path)
        assert drawn
        assert any(f"(charts/{name})" in page for name in drawn), path.name
