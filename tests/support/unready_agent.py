"""TEST-ONLY launcher: ``python -m tests.support.unready_agent <nodeagent arguments>`` is the
`nodeagent` command with one more supervised component, ``debug-unready``, that is not ready
while the running config's field shows as a value, given as
``NODEAGENT_TEST_UNREADY_WHEN=table.field=VALUE`` (``str()`` of the value). It lets a process
test make any config "unhealthy" on purpose, to test the trial and its rollback apart from the
real health signals (which tests/process/test_dynconfig_rollback_unpublished_pool.py drives).
Nothing in `nodeagent` itself reads that variable: a production run cannot reach this hook.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import trio

from nodeagent.service import agent as agent_module

UNREADY_WHEN_ENV = "NODEAGENT_TEST_UNREADY_WHEN"


class UnreadyWhen:
    """Not ready while the config's field shows as ``value``."""

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


def main() -> int:
    path, sep, value = os.environ.get(UNREADY_WHEN_ENV, "").partition("=")
    if not sep or "." not in path:
        raise SystemExit(f"{UNREADY_WHEN_ENV} must be table.field=VALUE")

    base = agent_module.Agent

    class Agent(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.extra_components.append(UnreadyWhen(path, value, lambda: self.config))

    agent_module.Agent = Agent  # type: ignore[misc]
    from nodeagent.cli import main as nodeagent_main

    return nodeagent_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
