"""Static configuration (TOML file + flags) and, later, the dynamic configuration manager."""
