"""Fleet-safe configuration rollout: the policy and status of a NodeAgentConfig's rollout
(``api``), the rank order and an agent's admission (``rank``), and the controller's pure step
(``plan``). Imported module by module."""

__all__: list[str] = []
