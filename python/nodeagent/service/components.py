"""Adapters that put other packages' long-running objects under the supervisor."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from nodeagent.core.component import Readiness


class PluginManagerLike(Protocol):
    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    def status(self) -> list[dict[str, Any]]: ...

    def readiness(self) -> Readiness: ...


class PluginsComponent:
    name = "plugins"

    def __init__(self, manager: PluginManagerLike) -> None:
        self.manager = manager

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.manager.run(task_status=task_status)

    def readiness(self) -> Readiness:
        return self.manager.readiness()
