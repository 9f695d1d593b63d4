"""TEST-ONLY launcher for the soak: ``python -m tests.soak.crash_agent <nodeagent arguments>`` is
the `nodeagent` command with one more supervised component, ``soak-crash``, that makes the
process exit at once (``os._exit``, no cleanup: as a crash does) while the running config's
``plugins.scan_interval`` is in `CRASH_RANGE`. The soak's crash-inducing NodeAgentConfig carries
such a value, so the agent dies during that config's trial and must roll it back at its next
start (docs/testing/soak.md). Nothing in `nodeagent` itself knows of it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import trio

from nodeagent.service import agent as agent_module

# plugins.scan_interval values that crash the agent: disjoint from the soak's good [0.3, 0.5),
# invalid [0.6, 0.8) and local (0.2) values.
CRASH_RANGE = (0.9, 1.0)
CRASH_EXIT = 70  # the exit status of an induced crash: the soak tells it from any other exit
CHECK_EVERY = 0.05  # seconds: the config is read this often


def crashes(scan_interval: float) -> bool:
    return CRASH_RANGE[0] <= scan_interval < CRASH_RANGE[1]


class CrashWhen:
    """Exits the process while the config's plugins.scan_interval is in CRASH_RANGE."""

    name = "soak-crash"

    def __init__(self, config: Callable[[], Any]) -> None:
        self.config = config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            scan = float(self.config().plugins.scan_interval)
            if crashes(scan):
                sys.stderr.write(f"soak-crash: plugins.scan_interval {scan}: crashing\n")
                sys.stderr.flush()
                os._exit(CRASH_EXIT)
            await trio.sleep(CHECK_EVERY)


def main() -> int:
    base = agent_module.Agent

    class Agent(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.extra_components.append(CrashWhen(lambda: self.config))

    agent_module.Agent = Agent  # type: ignore[misc]
    from nodeagent.cli import main as nodeagent_main

    return nodeagent_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
