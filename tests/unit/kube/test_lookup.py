"""`lookup_kind`: the one lookup of an optional kind (a CRD that may not be installed) the
dynamic-config and CNR components share: served, not served (why), or discovery failed (why)."""

from __future__ import annotations

from typing import Any, cast

import trio

from nodeagent.kube import KubeClient, lookup_kind
from nodeagent.kube.errors import Forbidden, NotFound


class Client:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.asked: list[tuple[str, str]] = []

    async def discover(self, api_version: str, kind: str) -> object:
        self.asked.append((api_version, kind))
        if self.error is not None:
            raise self.error
        return object()


def lookup(error: Exception | None) -> Any:
    client = Client(error)
    found = trio.run(lookup_kind, cast(KubeClient, client), "example.com/v1", "Thing")
    assert client.asked == [("example.com/v1", "Thing")]
    return found


def test_a_served_kind() -> None:
    found = lookup(None)
    assert found.served and found.missing is None and found.error is None


def test_a_kind_not_served_says_why() -> None:
    found = lookup(NotFound(404, "NotFound", "kind Thing is not served by example.com/v1"))
    assert not found.served and found.error is None
    assert found.missing is not None and "not served" in found.missing


def test_a_failed_discovery_is_not_taken_for_a_missing_kind() -> None:
    found = lookup(Forbidden(403, "Forbidden", "discovery is forbidden"))
    assert not found.served and found.missing is None
    assert found.error is not None and "forbidden" in found.error
