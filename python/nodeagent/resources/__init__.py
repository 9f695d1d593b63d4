"""Device inventories of node plugins published as resource.k8s.io/v1 ResourceSlices.

`model` (v1 structs, the inventory model, validation, split into slices), `convert` (seed and
native plugin APIs into the inventory model), `publisher` (desired vs observed, the Rust plan,
writes), `queue`, `events`, `settings`, `metrics`. The hot path (canonical hashing, semantic
equality, the plan) is in `nodeagent._native` (rust/src/planner).
"""

__all__: list[str] = []
