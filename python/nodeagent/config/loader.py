"""The static configuration file, whatever its schema: reading the TOML document, `--set`
overrides, the defaults that depend on the environment (user, hostname), and translating
msgspec's validation errors into `ConfigError`s naming the field (as a dotted TOML path), the
value and the rule.

The composed schema (one table per package) and `load_config` live in the composition root,
`nodeagent.service.config`: this package is a leaf that knows no other package's settings.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import constraint_rule

DEFAULT_CONFIG_PATH = "/etc/nodeagent/config.toml"
ROOT_STATE_DIR = "/var/lib/nodeagent"
REGISTRY_SUBDIR = "plugins_registry"


@dataclass(frozen=True, slots=True)
class Environment:
    """What defaults depend on, injectable so tests can be root or not without being root."""

    uid: int
    env: Mapping[str, str]
    hostname: str
    home: str

    @classmethod
    def current(cls) -> Environment:
        return cls(
            uid=os.geteuid(),
            env=dict(os.environ),
            hostname=socket.gethostname(),
            home=os.path.expanduser("~"),
        )


@dataclass(frozen=True, slots=True)
class Override:
    """One `section.key = value` coming from the command line; `value` is already typed."""

    key: str
    value: Any
    source: str = field(default="--set")


def default_state_dir(environment: Environment) -> str:
    if environment.uid == 0:
        return ROOT_STATE_DIR
    xdg = environment.env.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg.startswith("/"):
        return os.path.join(xdg, "nodeagent")
    return os.path.join(environment.home, ".local", "state", "nodeagent")


def default_registry_dir(environment: Environment | None = None) -> str:
    """Where an agent started with default settings looks for plugin sockets."""
    return os.path.join(default_state_dir(environment or Environment.current()), REGISTRY_SUBDIR)


def default_node_name(environment: Environment) -> str:
    return (environment.env.get("NODE_NAME") or environment.hostname).strip().lower()


def parse_set_value(text: str) -> Any:
    """`--set` values are TOML literals (`1.5`, `true`, `[0, 1000]`, `"x"`); anything that is not
    valid TOML (a bare path or word) is taken as a string, which is what a user typing
    `--set kube.context=prod` means."""
    try:
        return msgspec.toml.decode(f"v = {text}".encode())["v"]
    except msgspec.DecodeError:
        return text


def parse_set(assignment: str) -> Override:
    key, sep, value = assignment.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+", key):
        raise ConfigError(
            "--set", assignment, "must be SECTION.KEY=VALUE (e.g. plugins.scan_interval=2)"
        )
    return Override(key, parse_set_value(value.strip()))


# A node agent's config file is a few KiB; anything far larger is not one (or is /dev/zero).
MAX_CONFIG_BYTES = 1024 * 1024


def read_config_file(path: str | None) -> tuple[dict[str, Any], str | None]:
    """The raw TOML document and the path it came from (None: the default file is absent).

    The file must be a regular file (or /dev/null) of at most MAX_CONFIG_BYTES, in UTF-8: a
    FIFO, another device or a directory is refused at once (opened without blocking, checked
    before any read), and the read stops at the bound, so no input can hang or exhaust the
    process."""
    explicit = path is not None
    target = path if path is not None else DEFAULT_CONFIG_PATH
    try:
        # O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        if explicit:
            raise ConfigError("--config", target, "file does not exist") from None
        return {}, None
    except OSError as exc:
        raise ConfigError("--config", target, f"cannot be read: {exc.strerror}") from None
    info = os.fstat(fd)
    if not (stat.S_ISREG(info.st_mode) or _is_null_device(info)):
        os.close(fd)
        raise ConfigError("--config", target, "must be a regular file")
    if info.st_size > MAX_CONFIG_BYTES:
        os.close(fd)
        raise ConfigError("--config", target, f"is larger than {MAX_CONFIG_BYTES} bytes")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_CONFIG_BYTES + 1)  # the file may have grown since fstat
        except OSError as exc:
            raise ConfigError("--config", target, f"cannot be read: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("--config", target, f"is larger than {MAX_CONFIG_BYTES} bytes")
    return decode_toml(data, target), target


def _is_null_device(info: os.stat_result) -> bool:
    """`--config /dev/null` (no settings, every default) is a common idiom: it reads as empty."""
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)


def decode_toml(data: bytes, source: str) -> dict[str, Any]:
    """A TOML document from bytes that must be UTF-8; errors name `source` and where."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            "--config",
            source,
            f"not valid UTF-8: byte 0x{data[exc.start]:02x} at byte offset {exc.start} "
            f"(line {line})",
        ) from None
    try:
        raw: dict[str, Any] = msgspec.toml.decode(data)
    except msgspec.DecodeError as exc:
        raise ConfigError("--config", source, f"invalid TOML: {exc}") from None
    return raw


def apply_overrides(raw: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for ov in overrides:
        *parents, leaf = ov.key.split(".")
        node = out
        walked: list[str] = []
        for part in parents:
            walked.append(part)
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(walked), child, f"is not a table, cannot set {ov.key}")
            node[part] = child = dict(child)
            node = child
        node[leaf] = ov.value
    return out


# msgspec's message for a value outside a `msgspec.Meta` range: "Expected `float` >= 0.0".
_OUT_OF_RANGE = re.compile(r"Expected `\w+` [<>]=? ")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _PATH_PART.findall(path)]


def _dotted(parts: Sequence[str | int]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text


def _lookup(raw: Any, parts: Sequence[str | int]) -> Any:
    node = raw
    for p in parts:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _struct_at(
    root: type[msgspec.Struct], parts: Sequence[str | int]
) -> type[msgspec.Struct] | None:
    node: Any = root
    for p in parts:
        if not (isinstance(node, type) and issubclass(node, msgspec.Struct)) or isinstance(p, int):
            return None
        info = {f.name: f.type for f in msgspec.structs.fields(node)}
        if p not in info:
            return None
        node = info[p]
    return node if isinstance(node, type) and issubclass(node, msgspec.Struct) else None


def _literal_choices(root: type[msgspec.Struct], parts: Sequence[str | int]) -> list[str]:
    owner = _struct_at(root, parts[:-1])
    if owner is None or not parts:
        return []
    for f in msgspec.structs.fields(owner):
        if f.name == parts[-1]:
            return [str(a) for a in typing.get_args(f.type) if isinstance(a, str)]
    return []


def translate_validation_error(
    exc: msgspec.ValidationError, raw: Any, root: type[msgspec.Struct]
) -> ConfigError:
    """`Expected float, got str - at $.plugins.scan_interval` -> ConfigError naming
    `plugins.scan_interval`, the offending value and the rule."""
    message = str(exc)
    rule, _, at = message.partition(" - at `$")
    parts = _split_path(at.rstrip("`"))
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", rule)
    if unknown:
        owner = _struct_at(root, parts)
        parts = [*parts, unknown.group(1)]
        rule = "unknown field"
        if owner is not None:
            rule += " (known: " + ", ".join(f.name for f in msgspec.structs.fields(owner)) + ")"
    elif rule.startswith("Invalid enum value"):
        choices = _literal_choices(root, parts)
        if choices:
            rule += " (allowed: " + ", ".join(choices) + ")"
    elif _OUT_OF_RANGE.match(rule):
        # A typed constraint (core.rules): its own rule text, as validate() words it.
        owner = _struct_at(root, parts[:-1])
        named = constraint_rule(owner, str(parts[-1])) if owner is not None and parts else None
        rule = named or rule
    rule = rule.replace("`", "")
    rule = rule[:1].lower() + rule[1:]
    return ConfigError(_dotted(parts) or "(document)", _lookup(raw, parts), rule)


def validate_section(section: str, settings: Any) -> None:
    try:
        settings.validate()
    except ConfigError as exc:
        name = exc.field if exc.field.startswith(f"{section}.") else f"{section}.{exc.field}"
        raise ConfigError(name, exc.value, exc.rule) from None
    except ValueError as exc:  # a section that predates ConfigError: keep its message
        raise ConfigError(section, None, str(exc)) from None
