"""TEST-ONLY hooks, enabled by environment variables that production never sets.

They let the process tests reproduce situations that are otherwise timing-dependent:
- `NODEAGENT_DEBUG_BLOCK_LOOP_FILE=PATH`: while PATH exists, the heartbeat tick blocks the whole
  Trio loop (a stuck main loop), so the systemd watchdog ping must stop. `PATH.blocked` exists
  while the loop is blocked.
- `NODEAGENT_DEBUG_HANG_SHUTDOWN=1`: a shutdown hook that never returns, so a second signal and
  the shutdown deadline can be observed.

A config that makes a component not ready on purpose has no hook here: a production run must
not be able to fake its health. Process tests use a test-only launcher
(`tests/support/unready_agent.py`), or a real fault.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import trio

from nodeagent.log import get_logger

log = get_logger(__name__)

BLOCK_LOOP_ENV = "NODEAGENT_DEBUG_BLOCK_LOOP_FILE"
HANG_SHUTDOWN_ENV = "NODEAGENT_DEBUG_HANG_SHUTDOWN"


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
