"""Dynamic node configuration: NodeAgentConfig objects targeting this node, applied on trial,
with last-known-good, rollback and checkpoints. Imported module by module."""

__all__: list[str] = []
