"""Fixtures the benches share with the tests: `registry`, a plugin registry directory under /tmp
(tests/conftest.py; unix socket paths are short)."""

from tests.conftest import registry

__all__ = ["registry"]
