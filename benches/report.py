"""Printing a bench module's side-by-side summary after its last benchmark."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest


def print_uncaptured(
    request: pytest.FixtureRequest, report: Callable[[Callable[[str], None]], None]
) -> None:
    """Run `report(print)` with pytest's output capture off, so the ratios show without `-s`."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        report(print)
