"""Moved to `nodeagent.core.latest` (issue 10); this name stays until plugins/ imports the leaf."""

from nodeagent.core.latest import LatestValue

__all__ = ["LatestValue"]
