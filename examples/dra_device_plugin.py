"""An example seed (Kubernetes 1.30, DRA v1alpha3) device plugin built on the nodeagent SDK.

It lists --devices fake accelerators as named resources and keeps the list-and-watch stream
open; the agent (or a 1.30 kubelet) turns them into ResourceSlices:

    python examples/dra_device_plugin.py [--registry-dir DIR]

SIGINT or SIGTERM stops it and removes its sockets.
"""

from __future__ import annotations

import argparse
import signal

import trio

from nodeagent.config.loader import default_registry_dir
from nodeagent.log import configure_logging, get_logger
from nodeagent.sdk import Device, DevicePlugin, Quantity, SemVer

log = get_logger("examples.dra_device_plugin")


def devices(count: int) -> list[Device]:
    return [
        Device(
            f"accel-{i}",
            {
                "index": i,
                "model": "example-accelerator",
                "memory": Quantity("16Gi"),
                "driverVersion": SemVer("1.0.0"),
                "healthy": True,
            },
        )
        for i in range(count)
    ]


async def main(registry_dir: str, name: str, count: int, separate_endpoint: bool) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with DevicePlugin.serve(
            name=name, registry_dir=registry_dir, separate_endpoint=separate_endpoint
        ) as plugin:
            await plugin.publish(devices(count))
            log.info("device plugin serving", socket=plugin.socket_path, devices=count)
            async for signum in signals:
                log.info("stopping", signal=signal.Signals(signum).name)
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--registry-dir",
        default=default_registry_dir(),
        help="the agent's plugin registry dir (default: the agent's default, %(default)s)",
    )
    parser.add_argument("--name", default="accel.example.com", help="driver (plugin) name")
    parser.add_argument("--devices", type=int, default=4, help="number of devices to list")
    parser.add_argument(
        "--separate-endpoint",
        action="store_true",
        help="serve v1alpha3.Node on its own hidden socket instead of the registration socket",
    )
    args = parser.parse_args()
    configure_logging()
    trio.run(main, args.registry_dir, args.name, args.devices, args.separate_endpoint)
