"""nodeagent: a Kubernetes node agent with a Rust hot path."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("nodeagent")
except _metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
