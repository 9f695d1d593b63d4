"""Follow one NodeAgentConfig as an agent does (a watch through the accumulator), calling
``step`` with the object each time it changes: the simulated agents of the rollout tests and
benches react to the controller's status with it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from nodeagent.accumulator import Accumulator, ObjectMap, Query
from nodeagent.kube import KubeClient
from tests.support.nodeagentconfig import NAC

__all__ = ["follow_nodeagentconfig"]


@dataclass
class _Snap:
    nac: ObjectMap[bytes] = field(default_factory=ObjectMap)


async def follow_nodeagentconfig(
    client: KubeClient, name: str, step: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    """Runs until cancelled; ``step`` gets the object (decoded JSON) after every change."""
    query: Query[bytes] = Query("nac", NAC.api_version, NAC, field_selector=f"metadata.name={name}")
    acc = Accumulator(client, [query])
    snap = _Snap()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acc.run)
        while True:
            await acc.changed()
            acc.update(snap)
            raw = snap.nac.lookup("", name)
            if raw is not None:
                await step(msgspec.json.decode(raw))
