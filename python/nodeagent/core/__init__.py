"""Leaf primitives every other package builds on; this package imports nothing of nodeagent.

- `errors`: `ConfigError`, the one error type for a setting or value that breaks a rule;
- `backoff`: `Backoff`, the one capped exponential retry policy (with its `Jitter` models);
- `latest`: `LatestValue`, the newest-value-wins channel between producers and consumers;
- `plugindata`: `PluginData`, what the plugin handlers' channels carry to their consumers;
- `k8s`: the Kubernetes value rules (DNS labels and subdomains, qualified names, label keys and
  values, semantic versions, RFC 3339 times) and `resource.Quantity` (grammar, value, canonical
  form), the Python reference the Rust extension is tested against;
- `health`: `Lapses`, since when each item of a health signal has been failing, so a component
  turns not ready only past the signal's bound.

Import the submodules themselves; this module re-exports nothing, so importing one primitive
does not load the others (`errors` is imported by every settings module).
"""

__all__: list[str] = []
