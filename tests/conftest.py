"""Settings and fixtures for every test directory."""

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import settings

# A loaded CI machine (two cores, an apiserver and agent processes beside the tests) runs some
# examples slower than Hypothesis's 200 ms default deadline; a deadline miss there says nothing
# about the code under test, so no property or state-machine test has one.
settings.register_profile("explore", deadline=None, print_blob=True)
# The test command's default: the same examples on every run, so a run's verdict is the code's
# and not the draw's. New examples are searched for with NODEAGENT_HYPOTHESIS=explore (random,
# and failures kept in .hypothesis/ and replayed until fixed).
settings.register_profile("repeatable", deadline=None, print_blob=True, derandomize=True)
settings.load_profile(
    "explore" if os.environ.get("NODEAGENT_HYPOTHESIS") == "explore" else "repeatable"
)

# The real-node tests run in their own lane (scripts/test-real-node: root, a network namespace of
# the run's own, a kubelet and containerd); elsewhere they are not collected at all, so no run
# shows them as skipped.
collect_ignore = [] if os.environ.get("NODEAGENT_REAL_NODE") == "1" else ["realnode"]


@pytest.fixture
def registry() -> Iterator[str]:
    """A plugin registry directory under /tmp: unix socket paths are limited to 107 bytes, and
    pytest's tmp_path can be longer."""
    path = tempfile.mkdtemp(prefix="na-reg-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
