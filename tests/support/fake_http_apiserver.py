"""An in-process fake apiserver on httpx.MockTransport, for fault injection under Trio's
autojump clock (no sockets, so virtual time is exact)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import trio

from nodeagent.kube import KubeClient
from nodeagent.kube.kubeconfig import ClusterConfig

Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]


def mock_client(handler: Handler, config: ClusterConfig | None = None, **kwargs: Any) -> KubeClient:
    cfg = config or ClusterConfig(server="http://kube.test")
    kwargs.setdefault("rng", random.Random(1))
    return KubeClient(cfg, transport=httpx.MockTransport(handler), **kwargs)


def status(code: int, reason: str, message: str = "", **headers: str) -> httpx.Response:
    body = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return httpx.Response(code, json=body, headers=headers)


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def line(type: str, o: dict[str, Any]) -> bytes:
    return json.dumps({"type": type, "object": o}).encode() + b"\n"


class FakeCluster:
    """Serves lists from ``objects`` at ``rv``; each watch request takes the next script.

    A script is an `httpx.Response`, or a list of byte chunks streamed then closed. With no
    script left, the watch stays open and silent.
    """

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}
        self.rv = "10"
        self.list_errors: list[httpx.Response] = []
        self.scripts: list[httpx.Response | list[bytes]] = []
        self.lists: list[float] = []
        self.watches: list[tuple[float, str]] = []
        self.changed = trio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        self.changed.set()
        self.changed = trio.Event()
        if params.get("watch") != "true":
            self.lists.append(trio.current_time())
            if self.list_errors:
                return self.list_errors.pop(0)
            items = [obj(n, rv) for n, rv in sorted(self.objects.items())]
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": self.rv}, "items": items}
            )
        self.watches.append((trio.current_time(), params["resourceVersion"]))
        script = self.scripts.pop(0) if self.scripts else None
        if isinstance(script, httpx.Response):
            return script
        return httpx.Response(200, content=_stream(script))

    async def wait(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(10_000):
            while not predicate():
                await self.changed.wait()


async def _stream(chunks: list[bytes] | None) -> AsyncIterator[bytes]:
    if chunks is None:
        await trio.sleep_forever()
    for chunk in chunks or []:
        yield chunk
