"""`lock_state_dir`: one agent per state directory, the refusal naming the holder (issue 29
item 10). flock locks belong to an open file, so a second lock in this process is refused as
another process's would be; the process test covers a real second agent and a killed holder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.service.state_lock import LOCK_NAME, lock_state_dir


def test_a_second_lock_is_refused_naming_the_holder_and_the_field(tmp_path: Path) -> None:
    held = lock_state_dir(str(tmp_path), "node-a")
    with pytest.raises(ConfigError) as refused:
        lock_state_dir(str(tmp_path), "node-a")
    assert refused.value.field == "agent.state_dir"
    assert refused.value.rule.startswith(f"in use by nodeagent pid {os.getpid()} on node node-a")
    assert refused.value.rule.endswith("stop it or give this one another --state-dir")
    held.close()  # the holder ends: the next one locks and says who it is
    again = lock_state_dir(str(tmp_path), "node-b")
    assert '"node": "node-b"' in (tmp_path / LOCK_NAME).read_text()
    again.close()


def test_a_holder_that_has_not_said_who_it_is_is_still_refused(tmp_path: Path) -> None:
    held = lock_state_dir(str(tmp_path), "node-a")
    (tmp_path / LOCK_NAME).write_text("")  # locked a moment ago, not written yet
    with pytest.raises(ConfigError, match="in use by another process"):
        lock_state_dir(str(tmp_path), "node-a")
    held.close()
