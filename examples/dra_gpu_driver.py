"""A complete DRA driver in Python: partitionable example GPUs that a pod can use.

The device model is the upstream example driver's (kubernetes-sigs/dra-example-driver) with
partitions: each of --gpus GPUs is offered whole (``gpu-N``, 40Gi) or as two halves
(``gpu-N-a``, ``gpu-N-b``, 20Gi each), all drawing on the GPU's counter set, so a whole GPU and
a half of it are never allocated together. ``--tainted N`` publishes GPU N (and its halves)
with a ``gpu.example.com/maintenance`` NoSchedule taint: the scheduler skips them.

The kubelet side: a claim's devices are prepared by giving each container the environment
variable ``GPU_DEVICE_<n>=<device>`` for every device it was allocated, and ``GPU_MODE`` from the
opaque configuration ``{"mode": ...}`` of the DeviceClass or the claim (the claim's wins).
The SDK does the rest: reads the ResourceClaim, writes the CDI spec, keeps the checkpoint,
registers with the kubelet (``<kubelet-dir>/plugins_registry``) and with nodeagent
(``--registry-dir``), which publishes the ResourceSlices.

Health, as a sysfs check would find it: with ``--health-dir DIR`` a device is unhealthy while a
file ``DIR/<device>`` exists (its text the reason), checked every second. An unhealthy device is
reported to the kubelet (it shows in the status of the pods using it) and tainted
``gpu.example.com/unhealthy:NoSchedule`` in the published pool until the file goes.

    python examples/dra_gpu_driver.py [--registry-dir DIR] [--kubelet-dir /var/lib/kubelet]
        [--cdi-dir /var/run/cdi] [--kubeconfig FILE] [--gpus 2] [--tainted N] [--health-dir DIR]

`examples/dra_gpu_driver.yaml` has its DeviceClass, a ResourceClaimTemplate and a pod.
SIGINT or SIGTERM stops it and removes its sockets; prepared claims survive in its checkpoint.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence

import trio

from nodeagent.log import configure_logging, get_logger
from nodeagent.sdk import (
    Claim,
    ContainerEdits,
    CounterConsumption,
    CounterSet,
    Device,
    DevicePlugin,
    Health,
    KubeletPlugin,
    Pool,
    PreparedDevice,
    Taint,
    default_pool_name,
    default_registry_dir,
)

DRIVER = "gpu.example.com"
log = get_logger("examples.dra_gpu_driver")


def gpus(count: int, tainted: int | None) -> Pool:
    """The node's pool: per GPU a counter set and three partitions drawing on it."""
    devices: list[Device] = []
    counters: list[CounterSet] = []
    for i in range(count):
        taints = [Taint("gpu.example.com/maintenance", "true")] if i == tainted else []
        counters.append(CounterSet(f"gpu-{i}-counters", {"memory": "40Gi"}))
        for suffix, memory, partition in (
            ("", "40Gi", "whole"),
            ("-a", "20Gi", "half"),
            ("-b", "20Gi", "half"),
        ):
            devices.append(
                Device(
                    f"gpu-{i}{suffix}",
                    {"index": i, "partition": partition, "model": "example-gpu"},
                    capacity={"memory": memory},
                    consumes_counters=[CounterConsumption(f"gpu-{i}-counters", {"memory": memory})],
                    taints=taints,
                )
            )
    return Pool(default_pool_name(), devices, shared_counters=counters)


async def prepare(claim: Claim) -> Sequence[PreparedDevice]:
    """What the containers of `claim` get: one variable per device, and the mode."""
    prepared: list[PreparedDevice] = []
    for device in claim.devices:
        env = {f"GPU_DEVICE_{len(prepared)}": device.device}
        for config in device.config:  # the class's first, then the claim's: the last wins
            if isinstance(config.parameters, dict) and "mode" in config.parameters:
                env["GPU_MODE"] = str(config.parameters["mode"])
        prepared.append(PreparedDevice(device, ContainerEdits(env=env)))
    log.info("prepared", claim=f"{claim.namespace}/{claim.name}", devices=len(prepared))
    return prepared


async def watch_health(plugin: DevicePlugin, pool: Pool, health_dir: str) -> None:
    """Check every device each second and report it (a file in `health_dir`: unhealthy). Every
    check is reported, changed or not: the kubelet trusts a report for 30 s only."""
    reasons: dict[str, str | None] = {}
    while True:
        for device in pool.devices:
            path = trio.Path(health_dir, device.name)
            reason = (await path.read_text()).strip() if await path.exists() else None
            if reasons.get(device.name, "") != reason:
                log.info("device health", device=device.name, unhealthy=reason or "no")
            reasons[device.name] = reason
            health = Health.HEALTHY if reason is None else Health.UNHEALTHY
            await plugin.report_health(device.name, health, message=reason or "", taint=True)
        await trio.sleep(1)


async def log_kubelet_registration(plugin: DevicePlugin) -> None:
    """Say when the kubelet has registered the driver: from then on it prepares claims."""
    await plugin.wait_kubelet_registered()
    log.info("registered with the kubelet")


async def main(args: argparse.Namespace) -> None:
    kubelet = KubeletPlugin(
        prepare=prepare,
        kubelet_dir=args.kubelet_dir,
        cdi_dir=args.cdi_dir,
        cdi_kind=f"k8s.{DRIVER}/gpu",
        kubeconfig=args.kubeconfig,
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with DevicePlugin.serve(
            name=DRIVER, registry_dir=args.registry_dir, kubelet=kubelet
        ) as plugin:
            pool = gpus(args.gpus, args.tainted)
            await plugin.publish_pools([pool])
            log.info("driver serving", registry=args.registry_dir, kubelet=args.kubelet_dir)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log_kubelet_registration, plugin)
                if args.health_dir:
                    nursery.start_soon(watch_health, plugin, pool, args.health_dir)
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    break
                nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--registry-dir",
        default=default_registry_dir(),
        help="the agent's plugin registry dir (default: the agent's default, %(default)s)",
    )
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet", help="the kubelet's root dir")
    parser.add_argument("--cdi-dir", default="/var/run/cdi", help="the runtime's CDI spec dir")
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="read claims with it (default: $KUBECONFIG, else in-cluster)",
    )
    parser.add_argument("--gpus", type=int, default=2, help="number of GPUs")
    parser.add_argument("--tainted", type=int, default=None, help="taint this GPU (index)")
    parser.add_argument(
        "--health-dir", default=None, help="a device is unhealthy while DIR/<device> exists"
    )
    configure_logging()
    trio.run(main, parser.parse_args())
