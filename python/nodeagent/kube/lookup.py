"""The lookup of an optional kind: a CRD the agent uses when it is installed (NodeAgentConfig,
CustomNodeResource) and does without when not. One place says what discovery answered, so the
components that look one up tell "not installed" (run without it) from "discovery failed" (the
apiserver did not answer: ask again sooner) the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nodeagent.kube.errors import KubeError, NotFound
from nodeagent.log import get_logger

if TYPE_CHECKING:
    from nodeagent.kube.client import KubeClient

log = get_logger(__name__)

__all__ = ["KindLookup", "lookup_kind"]


@dataclass(frozen=True)
class KindLookup:
    """What discovery said of a kind: served, or why not (`missing`: not served; `error`:
    discovery failed, the kind's presence unknown)."""

    missing: str | None = None
    error: str | None = None

    @property
    def served(self) -> bool:
        return self.missing is None and self.error is None


async def lookup_kind(client: KubeClient, api_version: str, kind: str) -> KindLookup:
    """Whether the apiserver serves `kind` in `api_version`; a failed discovery is logged and
    returned, never raised (the caller looks again)."""
    try:
        await client.discover(api_version, kind)
    except NotFound as exc:
        return KindLookup(missing=str(exc))
    except KubeError as exc:
        log.warning("discovering a kind failed: retrying", kind=kind, error=str(exc))
        return KindLookup(error=str(exc))
    return KindLookup()
