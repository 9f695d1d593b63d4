"""Reports of reporter plugins (in-tree and out-of-tree), kept for the CNR reporter.

`model` (PluginReport, what the store publishes), `settings` (the `[reporter]` table), `store`
(each plugin's last report with its lifecycle: grace after deregistration, carry-over on
re-registration, checkpointed), `system` (the in-tree system reporter: node resource properties
and the Socket -> Numa topology from /proc and /sys).
"""

__all__: list[str] = []
