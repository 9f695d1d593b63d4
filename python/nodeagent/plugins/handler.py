"""The plugin-type interface: what the plugin manager needs from the handler of each plugin type
(`PluginHandler`), the plugin it is given (`PluginEndpoint`) and the errors refusing a plugin or
one of its messages. The streaming handler both built-in types share is `plugins.streaming`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData

__all__ = [
    "InvalidMessage",
    "PluginEndpoint",
    "PluginHandler",
    "PluginValidationError",
]


class PluginValidationError(Exception):
    """The plugin's name, endpoint or versions are not acceptable; the message says why."""


class InvalidMessage(Exception):
    """A plugin message decoded but its content breaks a rule; the message says which."""


@dataclass(frozen=True)
class PluginEndpoint:
    """A plugin that answered GetInfo. `endpoint` is the resolved socket of its service."""

    name: str
    plugin_type: str
    socket: str
    endpoint: str
    versions: tuple[str, ...]


class PluginHandler(Protocol):
    """What the manager needs from a plugin type.

    Besides validate/register/deregister, a handler has `run` (hosts its stream tasks under the
    manager's nursery, so they die with the manager) and `plugin_status` (for the ops endpoint).
    """

    plugin_type: str
    latest: LatestValue[Mapping[str, PluginData]]

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None: ...

    def validate(self, plugin: PluginEndpoint) -> None:
        """Raise PluginValidationError if the plugin may not register."""

    async def register(self, plugin: PluginEndpoint) -> None: ...

    async def deregister(self, plugin: PluginEndpoint) -> None:
        """Stop serving `plugin`; if it was serving its name and an older registration of the
        name is still live, serve that one again."""

    def plugin_status(self, name: str, *, message: bool = True) -> dict[str, Any] | None:
        """The plugin's stream status; ``message=False`` leaves its last message out (None):
        readiness asks at every heartbeat, and rendering 8,192 devices takes ~250 ms."""

    def plugin_names(self) -> list[str]: ...
