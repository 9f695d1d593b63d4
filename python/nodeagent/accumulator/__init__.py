"""Multi-kind, coalescing, bootstrap-gated snapshots of cluster objects over the Rust store."""

from nodeagent.accumulator.accumulator import (
    Accumulator,
    AccumulatorClient,
    QueryForbiddenError,
    Watch,
)
from nodeagent.accumulator.model import (
    Delta,
    DeltaType,
    ObjectKey,
    ObjectMap,
    Query,
    QueryState,
    QueryStatus,
)
from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.accumulator.watchhub import RECONNECT_GRACE, WatchHub, client_watch

__all__ = [
    "RECONNECT_GRACE",
    "Accumulator",
    "AccumulatorClient",
    "AccumulatorSettings",
    "Delta",
    "DeltaType",
    "ObjectKey",
    "ObjectMap",
    "Query",
    "QueryForbiddenError",
    "QueryState",
    "QueryStatus",
    "Watch",
    "WatchHub",
    "client_watch",
]
