"""Side-by-side bench charts for the docs, drawn from pytest-benchmark's JSON.

The benches in benches/ run the project's path and its baseline in one pytest-benchmark group;
`--benchmark-json FILE` saves a run. Each saved run under docs/performance/data/ becomes one SVG
per group (a bar per benchmark, its median time, the ratio to the fastest), so re-measuring is:
run the bench with `--benchmark-json`, replace the file, rebuild. Standard library only, no
network, no plotting library.

As a MkDocs hook (mkdocs.yml `hooks:`) the charts are generated at build time as
`performance/charts/<file stem>--<group, spaces as dashes>.svg`; the performance page links them
by that name, so a chart that is not generated (a renamed file or group) fails
`mkdocs build --strict`.
As a script: `python scripts/docs_charts.py OUT_DIR FILE.json...` writes the same SVGs.
"""

from __future__ import annotations

import json
import math
import re
import sys
from html import escape
from pathlib import Path
from typing import Any

DATA_DIR = "performance/data"
CHARTS_DIR = "performance/charts"

BAR_HEIGHT = 22
GAP = 8
LABEL_WIDTH = 260
BAR_WIDTH = 380
RIGHT = 170
TOP = 52


def _time(seconds: float) -> str:
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s")):
        if seconds >= scale:
            return f"{seconds / scale:,.3g} {name}"
    return f"{seconds / 1e-9:,.3g} ns"


def _ratio(ratio: float) -> str:
    return f"{ratio:,.0f}\u00d7" if ratio >= 100 else f"{ratio:.2g}\u00d7"


def _machine(run: dict[str, Any]) -> str:
    info = run.get("machine_info", {})
    cpu = info.get("cpu", {})
    parts = [
        str(cpu.get("brand_raw") or info.get("processor") or info.get("machine", "")),
        f"{cpu['count']} cores" if cpu.get("count") else "",
        f"{info.get('python_implementation', '')} {info.get('python_version', '')}".strip(),
    ]
    return ", ".join(p for p in parts if p)


def _label(bench: dict[str, Any], group: str) -> str:
    """A bench's name in its chart: its parameter when it has one, less the case the group
    already names (`rust-cold-stress-100-1pct` in group `plan stress-100-1pct`: `rust-cold`)."""
    label = str(bench.get("param") or bench["name"].removeprefix("test_"))
    case = group.split()[-1]
    return label.removesuffix("-" + case) if label != case else label


def _slug(group: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", group).strip("-")


def chart(run: dict[str, Any], group: str, title: str) -> str:
    """One SVG: the group's benchmarks as horizontal bars of their median time, fastest first."""
    rows = sorted(
        (b["stats"]["median"], _label(b, group))
        for b in run["benchmarks"]
        if (b.get("group") or b["name"]) == group
    )
    if not rows:
        raise ValueError(f"no benchmark in group {group!r}")
    fastest, slowest = rows[0][0], rows[-1][0]
    # Past two orders of magnitude a linear bar of the fastest would be invisible: log scale,
    # from a tenth of the fastest.
    log = fastest > 0 and slowest / fastest > 100
    floor = fastest / 10
    commit_info = run.get("commit_info", {})
    commit = str(commit_info.get("id", ""))[:9]
    subtitle = f"{run.get('datetime', '')[:16].replace('T', ' ')} UTC \u00b7 {_machine(run)}"
    if commit:
        dirty = " + uncommitted changes" if commit_info.get("dirty") else ""
        subtitle += f" \u00b7 commit {commit}{dirty}"
    width = LABEL_WIDTH + BAR_WIDTH + RIGHT
    height = TOP + len(rows) * (BAR_HEIGHT + GAP) + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f"<title>{escape(title)}: median time per round, lower is better</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="8" y="20" font-weight="bold">{escape(title)}</text>',
        f'<text x="8" y="38" font-size="11" fill="#555">{escape(subtitle)}</text>',
    ]
    for i, (median, name) in enumerate(rows):
        y = TOP + i * (BAR_HEIGHT + GAP)
        if log:
            share = math.log10(median / floor) / math.log10(slowest / floor)
        else:
            share = median / slowest if slowest > 0 else 0.0
        length = max(1.0, BAR_WIDTH * share)
        fill = "#3f51b5" if i == 0 else "#9fa8da"
        ratio = median / fastest if fastest > 0 else float("inf")
        label = _time(median) + ("" if i == 0 else f"  ({_ratio(ratio)})")
        out += [
            f'<text x="{LABEL_WIDTH - 8}" y="{y + 15}" text-anchor="end">{escape(name)}</text>',
            f'<rect x="{LABEL_WIDTH}" y="{y}" width="{length:.1f}" height="{BAR_HEIGHT}" '
            f'fill="{fill}"/>',
            f'<text x="{LABEL_WIDTH + length + 6:.1f}" y="{y + 15}">{escape(label)}</text>',
        ]
    out += [
        f'<text x="8" y="{height - 8}" font-size="11" fill="#555">median per round; '
        "ratio to the fastest in brackets; lower is better"
        + ("; bars on a log scale" if log else "")
        + "</text>",
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def charts(path: Path) -> dict[str, str]:
    """`{"<file stem>--<group>.svg": svg}` for every group of one saved run."""
    run = json.loads(path.read_text(encoding="utf-8"))
    groups = sorted({b.get("group") or b["name"] for b in run["benchmarks"]})
    return {f"{path.stem}--{_slug(g)}.svg": chart(run, g, f"{path.stem}: {g}") for g in groups}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated charts to the site's files (nothing written to docs/)."""
    from mkdocs.structure.files import File

    for path in sorted((Path(config["docs_dir"]) / DATA_DIR).glob("*.json")):
        for name, svg in charts(path).items():
            files.append(File.generated(config, f"{CHARTS_DIR}/{name}", content=svg))
    return files


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: docs_charts.py OUT_DIR FILE.json...", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for arg in argv[1:]:
        for name, svg in charts(Path(arg)).items():
            (out / name).write_text(svg, encoding="utf-8")
            print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
