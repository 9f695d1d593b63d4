"""The accumulator example of the docs (docs/architecture/accumulator.md, once the README's),
copied from the page, against the real apiserver."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from nodeagent.accumulator import DeltaType
from nodeagent.kube.client import KubeClient
from nodeagent.kube.resource import CONFIGMAPS
from tests.support.docs import code_block

pytestmark = pytest.mark.integration


async def test_the_readme_accumulator_example_follows_the_cluster(
    admin_client: KubeClient,
) -> None:
    namespace: dict[str, Any] = {}
    page, heading = "docs/architecture/accumulator.md", "# Accumulator (`nodeagent.accumulator`)"
    exec(code_block(page, heading, "python"), namespace)
    seen: list[tuple[list[str], list[tuple[DeltaType, str]]]] = []
    changed = trio.Event()

    def handle(view: Any, deltas: list[Any]) -> None:
        seen.append(([k.name for k in view.cms], [(d.type, d.key.name) for d in deltas]))
        changed.set()

    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "readme-owned", "labels": {"owner": "me"}},
    }
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "readme-other"}}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(namespace["follow"], admin_client, handle)
        with trio.fail_after(30):
            await changed.wait()  # bootstrapped: the first update
            changed = trio.Event()
            await admin_client.create(CONFIGMAPS, other, namespace="kube-system")
            await admin_client.create(CONFIGMAPS, body, namespace="kube-system")
            while "readme-owned" not in seen[-1][0]:
                await changed.wait()
                changed = trio.Event()
        nursery.cancel_scope.cancel()
    names, deltas = seen[-1]
    assert names == ["readme-owned"]  # the predicate keeps only labelled ConfigMaps
    assert (DeltaType.ADD, "readme-owned") in deltas
    assert all(name != "readme-other" for _, ds in seen for _, name in ds)
    for name in ("readme-owned", "readme-other"):
        await admin_client.delete(CONFIGMAPS, name, namespace="kube-system")
