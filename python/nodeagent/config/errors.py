"""Moved to `nodeagent.core.errors` (issue 10); this name stays until kube/ and plugins/ import
the leaf."""

from nodeagent.core.errors import ConfigError

__all__ = ["ConfigError"]
