"""Config input that used to crash, hang or be accepted is refused, naming what and why."""

from __future__ import annotations

import math
import os
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodeagent.cli import main
from nodeagent.config.loader import MAX_CONFIG_BYTES, Environment, read_config_file
from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import MAX_UID, MIN_SECONDS
from nodeagent.service.config import Config, build_config

USER = Environment(uid=1000, env={}, hostname="laptop", home="/home/u")


def _error(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_config(raw, (), USER)
    return info.value


def test_invalid_utf8_names_the_file_and_byte_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'[agent]\nnode_name = "n\xffx"\n')
    with pytest.raises(ConfigError) as info:
        read_config_file(str(path))
    assert info.value.field == "--config" and info.value.value == str(path)
    assert info.value.rule == "not valid UTF-8: byte 0xff at byte offset 22 (line 2)"
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "byte offset 22" in err and str(path) in err and "Traceback" not in err


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    for target, _ in [(str(tmp_path), "a directory"), ("/dev/zero", "a device")]:
        with pytest.raises(ConfigError, match="must be a regular file"):
            read_config_file(target)
    # /dev/null is the usual "no file, every default" and reads as empty.
    assert read_config_file("/dev/null") == ({}, "/dev/null")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # The old open() blocked here until a writer came (forever); O_NONBLOCK returns at once.
    with pytest.raises(ConfigError, match="must be a regular file"):
        read_config_file(str(fifo))


def test_the_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match=f"is larger than {MAX_CONFIG_BYTES} bytes"):
        read_config_file(str(path))
    path.write_bytes(b"#" * MAX_CONFIG_BYTES)
    assert read_config_file(str(path)) == ({}, str(path))


def test_relative_state_dir_is_refused() -> None:
    error = _error({"agent": {"state_dir": "var/state"}})
    assert (error.field, error.value, error.rule) == (
        "agent.state_dir",
        "var/state",
        "must be an absolute path",
    )


def test_empty_registry_dir_is_refused_not_taken_for_the_state_dir() -> None:
    error = _error({"plugins": {"registry_dir": ""}})
    assert (error.field, error.value, error.rule) == (
        "plugins.registry_dir",
        "",
        "must not be empty",
    )


@pytest.mark.parametrize("uid", [-1, MAX_UID + 1, 2**63, 2**64 - 1])
def test_uids_outside_uid_t_are_refused(uid: int) -> None:
    error = _error({"plugins": {"allowed_uids": [0, uid]}})
    assert error.field == "plugins.allowed_uids" and error.value == uid
    assert error.rule == f"a UID must be >= 0 and <= {MAX_UID}"


def test_the_largest_uid_is_accepted() -> None:
    config = build_config({"plugins": {"allowed_uids": [0, MAX_UID]}}, (), USER)
    assert config.plugins.allowed_uids == [0, MAX_UID]


def _floats(struct: Any) -> list[str]:
    # A typed constraint (core.rules) is Annotated[float, ...]: a float setting all the same.
    return [
        f.name
        for f in msgspec.structs.fields(struct)
        if f.type is float
        or (typing.get_origin(f.type) is typing.Annotated and typing.get_args(f.type)[0] is float)
    ]


# Every float setting of every table (durations, and kube.qps) must be finite and has a minimum;
# those where 0 means "no wait" or "at once" take any finite value >= 0.
ZERO_MEANS_NONE = {
    "plugins.stream_min_interval",
    "resources.disconnect_grace",
    "resources.startup_grace",
    "resources.min_sync_interval",
    "reporter.grace",
    "reporter.cnr_min_write_interval",
    "kube.watch_reconnect_spread",
}
FLOATS = [
    f"{table.name}.{name}"
    for table in msgspec.structs.fields(Config)
    for name in _floats(table.type)
]
CASES = [
    (path, value)
    for path in FLOATS
    for value in (1e-9, math.nan, math.inf, -1.0)
    if not (path in ZERO_MEANS_NONE and value == 1e-9)
]


def test_the_audit_covers_every_table() -> None:
    assert {p.partition(".")[0] for p in FLOATS} == {
        "agent",
        "ops",
        "plugins",
        "kube",
        "accumulator",
        "resources",
        "reporter",
        "dynconfig",
    }


@pytest.mark.parametrize(("path", "value"), CASES)
def test_every_float_setting_refuses_absurd_values(path: str, value: float) -> None:
    table, _, name = path.partition(".")
    error = _error({table: {name: value}})
    assert error.field == path
    assert error.value == value or (math.isnan(value) and math.isnan(float(str(error.value))))
    assert error.rule.startswith("must be")


def test_heartbeat_interval_names_its_minimum() -> None:
    error = _error({"agent": {"heartbeat_interval": 1e-9}})
    assert error.rule == "must be >= 0.01 (seconds)"
    error = _error({"plugins": {"scan_interval": 1e-9}})
    assert error.rule == f"must be >= {MIN_SECONDS:g} (seconds)"
