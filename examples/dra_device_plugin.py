"""An example DRA device plugin built on the nodeagent SDK.

It lists --devices fake accelerators in one pool (named after the node: $NODE_NAME or the
hostname) on the native `nodeagent.device.v1alpha1` API and keeps the list-and-watch stream open;
the agent turns them into resource.k8s.io/v1 ResourceSlices. With --seed it speaks the seed
(Kubernetes 1.30, DRA v1alpha3) API instead, which a 1.30 kubelet understands too. With
--consumable (native API only) each accelerator may be shared by several claims, each consuming
its memory in 1Gi steps (1Gi unless it asks for more: consumable capacity, Kubernetes 1.36+):

    python examples/dra_device_plugin.py [--registry-dir DIR] [--seed | --consumable]

SIGINT or SIGTERM stops it and removes its sockets.
"""

from __future__ import annotations

import argparse
import signal

import trio

from nodeagent.log import configure_logging, get_logger
from nodeagent.sdk import (
    Capacity,
    Device,
    DevicePlugin,
    RequestPolicy,
    SemVer,
    ValidRange,
    default_registry_dir,
)

log = get_logger("examples.dra_device_plugin")


def devices(count: int, consumable: bool = False) -> list[Device]:
    memory: str | Capacity = "16Gi"
    if consumable:
        steps = ValidRange(min="1Gi", max="16Gi", step="1Gi")
        memory = Capacity("16Gi", RequestPolicy(default="1Gi", valid_range=steps))
    return [
        Device(
            f"accel-{i}",
            {
                "index": i,
                "model": "example-accelerator",
                "driverVersion": SemVer("1.0.0"),
                "healthy": True,
            },
            capacity={"memory": memory},
            allow_multiple_allocations=consumable,
        )
        for i in range(count)
    ]


async def main(
    registry_dir: str,
    name: str,
    count: int,
    separate_endpoint: bool,
    seed: bool,
    consumable: bool = False,
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with DevicePlugin.serve(
            name=name,
            registry_dir=registry_dir,
            separate_endpoint=separate_endpoint,
            api="seed" if seed else "native",
        ) as plugin:
            await plugin.publish(devices(count, consumable))
            log.info(
                "device plugin serving", socket=plugin.socket_path, devices=count, api=plugin.api
            )
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
        help="serve the device service on its own hidden socket instead of the registration one",
    )
    parser.add_argument(
        "--seed",
        action="store_true",
        help="speak the seed v1alpha3.Node API (Kubernetes 1.30) instead of the native one",
    )
    parser.add_argument(
        "--consumable",
        action="store_true",
        help="let several claims share each device, consuming its memory in 1Gi steps",
    )
    args = parser.parse_args()
    if args.seed and args.consumable:
        parser.error("--consumable needs the native API (the seed API has no such field)")
    configure_logging()
    trio.run(
        main,
        args.registry_dir,
        args.name,
        args.devices,
        args.separate_endpoint,
        args.seed,
        args.consumable,
    )
