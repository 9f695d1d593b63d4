"""TEST-ONLY hooks, enabled by environment variables that production never sets.

They let the process tests reproduce situations that are otherwise timing-dependent:
- `NODEAGENT_DEBUG_BLOCK_LOOP_FILE=PATH`: while PATH exists, the heartbeat tick blocks the whole
  Trio loop (a stuck main loop), so the systemd watchdog ping must stop. `PATH.blocked` exists
  while the loop is blocked.
- `NODEAGENT_DEBUG_HANG_SHUTDOWN=1`: a shutdown hook that never returns, so a second signal and
  the shutdown deadline can be observed.
- `NODEAGENT_DEBUG_UNREADY_WHEN=table.field=VALUE`: a component `debug-unready` that is not ready
  while the running config's field shows as VALUE (`str()` of the value), so a config that makes
  the agent unhealthy (and its rollback) can be produced on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import trio

from nodeagent.log import get_logger

log = get_logger(__name__)

BLOCK_LOOP_ENV = "NODEAGENT_DEBUG_BLOCK_LOOP_FILE"
HANG_SHUTDOWN_ENV = "NODEAGENT_DEBUG_HANG_SHUTDOWN"
UNREADY_WHEN_ENV = "NODEAGENT_DEBUG_UNREADY_WHEN"


def block_loop_file(env: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if env is None else env).get(BLOCK_LOOP_ENV) or None


def blocked_marker(block_file: str) -> str:
    """The file that exists while the block-loop hook holds the loop."""
    return block_file + ".blocked"


def hang_shutdown(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(HANG_SHUTDOWN_ENV) == "1"


async def hanging_shutdown_hook() -> None:
    log.warning("debug hook: shutdown hook hangs until the deadline")
    await trio.sleep_forever()


def unready_when(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(table.field, value) of the unready hook, or None when it is off."""
    spec = (os.environ if env is None else env).get(UNREADY_WHEN_ENV) or ""
    path, sep, value = spec.partition("=")
    return (path, value) if sep and "." in path else None


class UnreadyWhen:
    """The unready hook's component: not ready while the config's field shows as `value`."""

    name = "debug-unready"

    def __init__(self, path: str, value: str, config: Callable[[], Any]) -> None:
        self.path, self.value, self.config = path, value, config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    def readiness(self) -> tuple[bool, str]:
        table, _, field = self.path.partition(".")
        current = getattr(getattr(self.config(), table, None), field, None)
        if str(current) == self.value:
            return False, f"test hook {UNREADY_WHEN_ENV}: {self.path} is {self.value}"
        return True, f"test hook: {self.path} is {current}"
