"""The nodeagent process: the composition root (`config`: the composed configuration schema;
`agent`: the process and its task tree), supervision, ops HTTP endpoint, sd_notify, heartbeat.
The one package that imports the components; nothing imports it but the command line."""

__all__: list[str] = []
