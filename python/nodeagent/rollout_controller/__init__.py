"""`nodeagent rollout-controller`: the process that rolls NodeAgentConfigs out in waves
(docs/architecture/rollout.md, "The controller process"). Imported module by module."""

__all__: list[str] = []
