"""An example Katalyst reporter plugin built on the nodeagent SDK.

It reports the node's CPU count and memory as the CustomNodeResource status field "Resources",
and the load average as an annotation, refreshed every --interval seconds:

    python examples/cpu_reporter.py [--registry-dir DIR]

SIGINT or SIGTERM stops it and removes its socket.
"""

from __future__ import annotations

import argparse
import os
import signal

import trio

from nodeagent.log import configure_logging, get_logger
from nodeagent.sdk import ReporterPlugin, ReportItem, default_registry_dir

log = get_logger("examples.cpu_reporter")
CNR = ("node.katalyst.kubewharf.io", "v1alpha1", "CustomNodeResource")


def snapshot() -> list[ReportItem]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    load1, load5, load15 = os.getloadavg()
    return [
        ReportItem(
            *CNR,
            field_type="Status",
            field_name="Resources",
            value={"allocatable": {"cpu": str(os.cpu_count() or 1), "memory": str(memory)}},
        ),
        ReportItem(
            *CNR,
            field_type="Metadata",
            field_name="Annotations",
            value={"example.nodeagent.io/loadavg": f"{load1:.2f} {load5:.2f} {load15:.2f}"},
        ),
    ]


async def main(registry_dir: str, name: str, interval: float) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            ReporterPlugin.serve(name=name, registry_dir=registry_dir) as plugin,
            trio.open_nursery() as nursery,
        ):
            log.info("reporter plugin serving", socket=plugin.socket_path)

            async def refresh() -> None:
                while True:
                    await plugin.report(snapshot())
                    await trio.sleep(interval)

            nursery.start_soon(refresh)
            async for signum in signals:
                log.info("stopping", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--registry-dir",
        default=default_registry_dir(),
        help="the agent's plugin registry dir (default: the agent's default, %(default)s)",
    )
    parser.add_argument("--name", default="cpu-reporter", help="plugin name (socket name too)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between reports")
    args = parser.parse_args()
    configure_logging()
    trio.run(main, args.registry_dir, args.name, args.interval)
