"""The config hub: all-or-nothing proposals (static fields, vetoes), live tables, and the agent's
SIGHUP reload keeping the running config when the file is invalid."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from nodeagent.config.loader import Environment
from nodeagent.core.errors import ConfigError
from nodeagent.service.agent import Agent
from nodeagent.service.config import Config, build_config
from nodeagent.service.confighub import ConfigHub, changed_fields
from nodeagent.service.metrics import CONFIG_RELOADS

ENV = Environment(uid=0, env={}, hostname="worker-1", home="/root")


def _config(**tables: dict[str, Any]) -> Config:
    return build_config({"ops": {"enabled": False}, **tables}, environment=ENV)


def test_changed_fields_are_dotted_paths() -> None:
    old = _config()
    new = _config(agent={"log_level": "debug"}, plugins={"scan_interval": 2.5})
    assert changed_fields(old, new) == ["agent.log_level", "plugins.scan_interval"]
    assert changed_fields(old, _config()) == []


def test_a_dynamic_change_swaps_the_table_and_tells_the_subscribers() -> None:
    hub = ConfigHub(_config())
    seen: list[tuple[float, float]] = []
    live = hub.plugins.subscribe(
        lambda old, new: None,
        on_applied=lambda old, new: seen.append((old.scan_interval, new.scan_interval)),
    )
    version = live.version
    result = hub.propose(_config(plugins={"scan_interval": 2.5}), "test")
    assert result.applied and result.changed == ["plugins.scan_interval"] and not result.vetoes
    assert live.value.scan_interval == 2.5 and live.version == version + 1
    assert hub.current.plugins.scan_interval == 2.5
    assert seen == [(1.0, 2.5)]
    assert hub.agent.version == 0  # untouched tables are not bumped


def test_a_static_field_refuses_the_whole_change_naming_the_field() -> None:
    hub = ConfigHub(_config())
    before = hub.current
    result = hub.propose(
        _config(agent={"node_name": "worker-2"}, plugins={"scan_interval": 2.5}), "test"
    )
    assert not result.applied
    assert result.vetoes == [
        ("static", "agent.node_name is static: restart the agent to change it")
    ]
    assert hub.current is before and hub.plugins.value.scan_interval == 1.0


def test_a_veto_discards_the_whole_change_and_no_subscriber_sees_part_of_it() -> None:
    hub = ConfigHub(_config())
    applied: list[str] = []
    hub.agent.subscribe(on_applied=lambda old, new: applied.append("agent"))
    hub.plugins.subscribe(
        lambda old, new: "cannot scan that fast now" if new.scan_interval < 1 else None,
        name="plugin-manager",
    )
    result = hub.propose(
        _config(agent={"log_level": "debug"}, plugins={"scan_interval": 0.5}), "test"
    )
    assert not result.applied
    assert result.vetoes == [("plugin-manager", "cannot scan that fast now")]
    assert result.reason() == "plugin-manager: cannot scan that fast now"
    assert applied == [] and hub.current.agent.log_level == "info"
    assert hub.agent.version == 0


def test_a_failing_veto_hook_refuses_instead_of_crashing() -> None:
    hub = ConfigHub(_config())

    def broken(old: Any, new: Any) -> str | None:
        raise RuntimeError("boom")

    hub.plugins.subscribe(broken)
    result = hub.propose(_config(plugins={"scan_interval": 2.5}), "test")
    assert not result.applied and result.vetoes == [("plugins", "veto hook failed: boom")]


@pytest.fixture
def root_level() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


class Files:
    """What SIGHUP re-reads: the next config, or the error the loader raises."""

    def __init__(self) -> None:
        self.next: Config | ConfigError = _config()

    def read(self) -> Config:
        if isinstance(self.next, ConfigError):
            raise self.next
        return self.next


def _count(result: str) -> float:
    return CONFIG_RELOADS.labels(result=result)._value.get()


def test_reload_applies_the_log_level_and_keeps_the_config_on_an_invalid_file(
    root_level: None,
) -> None:
    files = Files()
    agent = Agent(_config(), reloader=files.read)
    logging.getLogger().setLevel(logging.INFO)

    files.next = _config(agent={"log_level": "debug"}, plugins={"scan_interval": 3.0})
    applied = _count("applied")
    agent.reload()
    assert _count("applied") == applied + 1
    assert logging.getLogger().level == logging.DEBUG
    assert agent.config.plugins.scan_interval == 3.0
    assert agent.effective_config()["effective"]["agent"]["log_level"] == "debug"
    assert agent.last_reload is not None and agent.last_reload["result"] == "applied"

    files.next = ConfigError("plugins.scan_interval", -1, "must be a finite number > 0")
    invalid = _count("invalid")
    agent.reload()
    assert _count("invalid") == invalid + 1
    assert agent.config.plugins.scan_interval == 3.0
    assert agent.last_reload["result"] == "invalid"
    assert "plugins.scan_interval" in agent.last_reload["message"]
    assert agent.status()["config_reload"] == agent.last_reload

    files.next = _config(agent={"log_level": "debug", "node_name": "worker-2"})
    agent.reload()
    assert agent.last_reload["result"] == "refused"
    assert "agent.node_name is static: restart" in agent.last_reload["message"]
    assert agent.config.agent.node_name == "worker-1"

    agent.reload()  # the same refused file again: still refused, nothing half-applied
    files.next = agent.config
    agent.reload()
    assert agent.last_reload["result"] == "unchanged"
