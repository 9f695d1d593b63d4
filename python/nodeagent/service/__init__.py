"""The nodeagent process: supervision tree, ops HTTP endpoint, sd_notify, heartbeat."""
