"""A plugin process that serves what a JSON file says, again whenever the file changes: a
native-API DRA plugin publishing the device list in it (how a real driver republishes when its
hardware changes), or a Katalyst reporter plugin reporting the CNR annotations in it. The fault
matrix (tests/faults/env.py) and the soak (tests/soak/world.py) run it; `command` is its command
line.

No signal handling (as a killed or OOM-killed plugin): SIGKILL and SIGTERM leave its
registration socket behind.

The files: a DRA plugin's is a list of ``{"name", "attributes", "capacity"}``; beside it,
``<file>.flood`` holding a number n makes the plugin send n distinct inventories back to back
before the file's (a flood; the flood file is removed). A reporter plugin's is a list of
``{"name", "value"}``: one annotation each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

__all__ = ["command"]

POLL = 0.05  # seconds between two looks at the file


def command(
    kind: str, registry: str, path: Path, name: str, *, pool: str = "", register_as: str = ""
) -> list[str]:
    """The command line of a plugin process: `kind` "dra" (driver `name`, its pool `pool`) or
    "reporter" (plugin `name`), registering in `registry`, serving `path`. `register_as`: a DRA
    plugin serves from `registry` (private) and moves its registration socket to this path (a
    second instance of the driver, "<driver>-<uid>-reg.sock" as in a rolling update)."""
    # Run from the repository root on the path, not as a script: a script's own folder would
    # come first on the path, and tests/support/http.py would hide the standard library's.
    root = str(Path(__file__).resolve().parents[2])
    start = f"import sys; sys.path.insert(0, {root!r}); from {__name__} import main; main()"
    args = [sys.executable, "-c", start, kind, registry, str(path), name]
    if pool:
        args += ["--pool", pool]
    if register_as:
        args += ["--register-as", register_as]
    return args


def _load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _flood_size(path: str) -> int:
    """The size of the flood asked for beside `path` (0: none)."""
    try:
        with open(path + ".flood") as f:
            return int(f.read())
    except FileNotFoundError:
        return 0


async def _watch(path: str, send: Callable[[Any], Awaitable[None]]) -> None:
    seen = None
    while True:
        stamp = os.stat(path).st_mtime_ns
        if stamp != seen:
            seen = stamp
            await send(_load(path))
        await trio.sleep(POLL)


async def _dra(registry: str, path: str, driver: str, pool: str, register_as: str) -> None:
    from nodeagent.sdk import Device, DevicePlugin

    endpoint = os.path.join(registry, "dra.sock") if register_as else None

    def devices(found: list[dict[str, Any]], **more: object) -> list[Device]:
        return [
            Device(d["name"], dict(d["attributes"], **more), capacity=d["capacity"]) for d in found
        ]

    async with DevicePlugin.serve(
        name=driver, registry_dir=registry, api="native", pool=pool or None, endpoint=endpoint
    ) as plugin:
        if register_as:
            os.rename(os.path.join(registry, f"{driver}-reg.sock"), register_as)

        async def publish(found: list[dict[str, Any]]) -> None:
            flood = _flood_size(path)
            for i in range(flood):
                await plugin.publish(devices(found, flood=i))
                await trio.lowlevel.checkpoint()
            if flood:
                os.unlink(path + ".flood")  # sent: the test times the flood by this file
            await plugin.publish(devices(found))

        await _watch(path, publish)


async def _reporter(registry: str, path: str, name: str) -> None:
    from nodeagent.sdk import ReporterPlugin, ReportItem

    gvk = ("node.katalyst.kubewharf.io", "v1alpha1", "CustomNodeResource")
    async with ReporterPlugin.serve(name=name, registry_dir=registry) as plugin:

        async def report(fields: list[dict[str, str]]) -> None:
            annotations = {d["name"]: d["value"] for d in fields}
            await plugin.report([ReportItem(*gvk, "Metadata", "Annotations", annotations)])

        await _watch(path, report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=("dra", "reporter"))
    parser.add_argument("registry")
    parser.add_argument("path")
    parser.add_argument("name")
    parser.add_argument("--pool", default="")
    parser.add_argument("--register-as", default="")
    a = parser.parse_args(argv)
    if a.kind == "dra":
        trio.run(_dra, a.registry, a.path, a.name, a.pool, a.register_as)
    else:
        trio.run(_reporter, a.registry, a.path, a.name)


if __name__ == "__main__":
    main()
