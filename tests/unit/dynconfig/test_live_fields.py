"""plugins.stream_min_interval is live (a reload or remote config reaches open streams, and a
wait begun with the old interval ends early); accumulator.max_interval stays static (refused
with the field named) and must be finite, like the other accumulator intervals."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.core.errors import ConfigError
from nodeagent.core.latest import LatestValue
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.settings import PluginSettings
from nodeagent.service.config import Config, build_config
from nodeagent.service.confighub import DYNAMIC_FIELDS, ConfigHub
from tests.unit.plugins.test_stream_supervisor import (
    HANG,
    _field,
    _msg,
    _plugin,
    _received,
    _ScriptedHandler,
    _sleep,
)


async def test_a_shorter_stream_min_interval_reaches_an_open_stream(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    live = LatestValue(PluginSettings(stream_min_interval=60.0))
    handler = _ScriptedHandler([[_msg("a"), _sleep(1), _msg("b"), HANG]], live.value)
    handler.live_settings = live
    await nursery.start(handler.run)
    await handler.register(_plugin())
    start = trio.current_time()
    await trio.sleep(10)
    # "a" at once; "b" arrived at 1 s and waits for the 60 s interval.
    assert _field(handler) == "a" and _received(handler) == 1
    live.set(msgspec.structs.replace(live.value, stream_min_interval=0.1))
    await trio.sleep(0.5)
    assert _field(handler) == "b" and _received(handler) == 2
    assert trio.current_time() - start < 11  # not held until the old interval's end


async def test_the_manager_hands_its_live_settings_to_the_stream_handlers(
    tmp_path: Path,
) -> None:
    live = LatestValue(PluginSettings(registry_dir=str(tmp_path)))
    handler = _ScriptedHandler([], live.value)
    PluginManager(live, object(), [handler])  # type: ignore[arg-type]
    assert handler.live_settings is live


def test_stream_min_interval_is_dynamic_and_max_interval_static() -> None:
    assert "plugins.stream_min_interval" in DYNAMIC_FIELDS
    assert "accumulator.max_interval" not in DYNAMIC_FIELDS
    hub = ConfigHub(build_config({}))
    seen = hub.plugins
    result = hub.propose(build_config({"plugins": {"stream_min_interval": 0.5}}), "test")
    assert result.applied and result.changed == ["plugins.stream_min_interval"]
    assert seen.value.stream_min_interval == 0.5
    result = hub.propose(build_config({"accumulator": {"max_interval": 0.5}}), "test")
    assert not result.applied
    assert result.reason() == (
        "static: accumulator.max_interval is static: restart the agent to change it"
    )
    assert isinstance(hub.current, Config)


@pytest.mark.parametrize("field", ["max_interval", "forbidden_retry", "local_write_ttl"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0])
def test_accumulator_intervals_must_be_finite_and_positive(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"accumulator.{field}.*finite number > 0"):
        build_config({"accumulator": {field: value}})
    with pytest.raises(ConfigError, match=f"accumulator.{field}"):
        msgspec.structs.replace(AccumulatorSettings(), **{field: value}).validate()
