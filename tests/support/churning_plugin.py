"""A DRA plugin whose inventory keeps changing, in its own process: an SDK `DevicePlugin` (native
API) that publishes one GPU in pool ``<pool>`` with a new ``rev`` attribute every ``period``
seconds. With `resources.min_sync_interval` at its default (0.1 s) each change is published;
with an interval of an hour only the first one is, and the pool stays unpublished: the fault
the health bounds turn into a not-ready component and a dynamic-config trial into a rollback.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

DRIVER = "churn.example.com"

PLUGIN = """
import sys, trio
from nodeagent.sdk import Device, DevicePlugin

async def main(registry_dir, pool, period):
    async with DevicePlugin.serve(
        name="churn.example.com", registry_dir=registry_dir, api="native", pool=pool
    ) as plugin:
        rev = 0
        while True:
            await plugin.publish([Device("gpu-0", {"rev": rev}, capacity={"memory": "1Gi"})])
            rev += 1
            await trio.sleep(period)

trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
"""


@contextmanager
def churning_plugin(pool: str, period: float = 0.3) -> Iterator[str]:
    """Runs the plugin in a fresh registry directory (short path: unix sockets); yields it."""
    registry = tempfile.mkdtemp(prefix="na-churn-", dir="/tmp")
    proc = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, registry, pool, str(period)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield registry
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            assert proc.stderr is not None
            proc.stderr.close()
            shutil.rmtree(registry, ignore_errors=True)
