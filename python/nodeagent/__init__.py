"""nodeagent: a Kubernetes node agent with a Rust hot path."""

try:
    # The version maturin builds into the extension from rust/Cargo.toml, the one place it is
    # written; importlib.metadata (with email, zipfile, csv: ~0.8 MiB) is not loaded for it.
    from nodeagent._native import __version__
except ImportError:  # a source tree whose extension is not built
    from importlib import metadata as _metadata

    try:
        __version__ = _metadata.version("nodeagent")
    except _metadata.PackageNotFoundError:
        __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
