"""TEST-ONLY launcher: ``python -m tests.support.hooked_agent <nodeagent arguments>`` is the
`nodeagent` command with the hooks the process tests need to reproduce situations that are
otherwise timing-dependent, each enabled by an environment variable:

- `NODEAGENT_TEST_BLOCK_LOOP_FILE=PATH`: while PATH exists, one more supervised component
  blocks the whole Trio loop (a stuck main loop), so the systemd watchdog ping must stop;
  `PATH.blocked` exists while the loop is blocked.
- `NODEAGENT_TEST_HANG_SHUTDOWN=1`: a shutdown hook that never returns, so a second signal and
  the shutdown deadline can be observed.

Nothing in `nodeagent` itself reads these variables: a production run cannot reach the hooks
(they lived in the product, service/debug.py, until issue 30 item 4).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import trio

from nodeagent.log import get_logger
from nodeagent.service import agent as agent_module

BLOCK_LOOP_ENV = "NODEAGENT_TEST_BLOCK_LOOP_FILE"
HANG_SHUTDOWN_ENV = "NODEAGENT_TEST_HANG_SHUTDOWN"
# How often the loop blocker looks for its file (the test waits for the marker, not for this).
LOOK_EVERY = 0.02

log = get_logger("nodeagent.test")


def blocked_marker(block_file: str) -> str:
    """The file that exists while the hook holds the loop."""
    return block_file + ".blocked"


class LoopBlocker:
    """While the file exists, blocks the Trio loop: every task, the heartbeat's watchdog ping
    included, stops as in a stuck main loop."""

    name = "test-block-loop"

    def __init__(self, block_file: str) -> None:
        self.block_file = block_file

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(LOOK_EVERY)
            self._block_while_there()

    def _block_while_there(self) -> None:
        if not os.path.exists(self.block_file):
            return
        log.warning("debug hook: blocking the main loop", file=self.block_file)
        # Tells a test the loop is now blocked: every ping before it has been sent.
        blocked = blocked_marker(self.block_file)
        with open(blocked, "w"):
            pass
        while os.path.exists(self.block_file):
            time.sleep(0.05)  # deliberately blocking: this simulates a stuck loop
        os.unlink(blocked)


async def hanging_shutdown_hook() -> None:
    log.warning("debug hook: shutdown hook hangs until the deadline")
    await trio.sleep_forever()


def main() -> int:
    block_file = os.environ.get(BLOCK_LOOP_ENV) or None
    hang = os.environ.get(HANG_SHUTDOWN_ENV) == "1"
    base = agent_module.Agent

    class Agent(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if block_file is not None:
                self.extra_components.append(LoopBlocker(block_file))
            if hang:
                self.add_shutdown_hook(hanging_shutdown_hook)

    agent_module.Agent = Agent  # type: ignore[misc]
    from nodeagent.cli import main as nodeagent_main

    return nodeagent_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
