"""The static configuration file, whatever its schema: TOML reading, `--set` overrides,
environment-dependent defaults, error translation (`loader`) and rendering (`render`).

A leaf: the composed schema is the composition root's (`nodeagent.service.config`).
"""

__all__: list[str] = []
