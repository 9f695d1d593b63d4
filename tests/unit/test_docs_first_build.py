"""The first start's build time is one figure wherever a newcomer reads it: the README's Quick
start, Getting started, and what `scripts/run` prints while it builds (issue 29 item 18: they
said 40-50 s, 168 s and "a minute or two")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = r"The first\s+start\s+builds\s+the\s+extension\s+\(([^)]*)\)"
# Where each place states it, and the words around the figure.
PLACES = {
    "README.md": SENTENCE,
    "docs/getting-started.md": SENTENCE,
    "scripts/run": r"\(first build: ([^)]*)\)",
}
# A sentence about that time, and a duration in it.
ABOUT = re.compile(r"first (?:start|build)|empty caches|builds the\s+extension|Rust build", re.I)
DURATION = re.compile(r"(\d+(?:\.\d+)?)(?:\u2013(\d+(?:\.\d+)?))? ?(s|min)\b|(a minute or two)")


def _figures(path: str, pattern: str) -> list[str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    return [" ".join(m.split()) for m in re.findall(pattern, text)]


def _seconds(match: tuple[str, str, str, str]) -> tuple[float, float]:
    low, high, unit, words = match
    if words:
        return 60.0, 120.0
    scale = 60.0 if unit == "min" else 1.0
    return float(low) * scale, float(high or low) * scale


def test_the_first_build_time_is_one_figure() -> None:
    figures = {path: _figures(path, pattern) for path, pattern in PLACES.items()}
    assert all(len(found) == 1 for found in figures.values()), figures
    assert len({found[0] for found in figures.values()}) == 1, figures


def test_every_measurement_of_it_is_within_the_figure() -> None:
    (figure,) = _figures("README.md", PLACES["README.md"])
    (bounds,) = DURATION.findall(figure)
    low, high = _seconds(bounds)
    for path in PLACES:
        text = " ".join((ROOT / path).read_text(encoding="utf-8").split())
        for sentence in re.split(r"(?<=[.;])\s", text):
            if ABOUT.search(sentence):
                for found in DURATION.findall(sentence):
                    first, last = _seconds(found)
                    assert low <= first and last <= high, (path, sentence)
