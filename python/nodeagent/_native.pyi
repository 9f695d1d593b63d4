"""Type stubs for the Rust extension `nodeagent._native`."""

__version__: str
