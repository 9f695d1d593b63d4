"""Leaf primitives every other package builds on; this package imports nothing of nodeagent.

- `component`: `Component`, the protocol every supervised part implements (`run`, `name`, an
  optional `readiness()`), `Readiness` and `FatalError` (a condition a restart cannot fix);
- `errors`: `ConfigError`, the one error type for a setting or value that breaks a rule;
- `rules`: the validation rules every package's settings share (typed range constraints);
- `backoff`: `Backoff`, the one capped exponential retry policy (with its `Jitter` models);
- `wake`: wake-ups and deadlines, the shapes the agent's loops wait in;
- `latest`: `LatestValue`, the newest-value-wins channel between producers and consumers;
- `plugindata`: `PluginData`, what the plugin handlers' channels carry to their consumers;
- `k8s`: the Kubernetes value rules (DNS labels and subdomains, qualified names, label keys and
  values, semantic versions, RFC 3339 times); `resource.Quantity` is the Rust extension's
  (`nodeagent._native`), with its plain-Python reference in tests/support/quantity.py;
- `health`: `Lapses`, since when each item of a health signal has been failing, so a component
  turns not ready only past the signal's bound.

Import the submodules themselves; this module re-exports nothing, so importing one primitive
does not load the others (`errors` is imported by every settings module).
"""

__all__: list[str] = []
