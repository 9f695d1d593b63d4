"""Settings of the Kubernetes client and `load_client`, which picks the cluster connection."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import (
    RULE,
    AtLeastOne,
    check_constraints,
    check_seconds,
    count,
    finite,
)
from nodeagent.kube.client import KubeClient, WatchOptions
from nodeagent.kube.dryrun import DryRun
from nodeagent.kube.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    in_cluster_available,
    in_cluster_config,
    load_kubeconfig,
)


class KubeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[kube]`` in the config file."""

    # Path of a kubeconfig (YAML or JSON). None: in-cluster if in a pod, else standalone.
    kubeconfig: str | None = None
    # Context to use; None: the kubeconfig's current-context.
    context: str | None = None
    # "auto": use the pod's service account when no kubeconfig is given and we run in a pod.
    in_cluster: Literal["auto", "never", "always"] = "auto"
    # Client-side token bucket shared by every request, watch reconnect and list.
    qps: Annotated[float, finite(ge=0.01)] = 20.0
    burst: AtLeastOne = 40
    # Deadline of one unary request attempt, in seconds.
    request_timeout: float = 30.0
    # A watch that receives nothing (not even a bookmark) for this long is reconnected.
    watch_inactivity_timeout: Annotated[float, finite(ge=5, rule="must be >= 5")] = 70.0
    # Attempts of a unary request (retries of retryable failures included).
    max_attempts: AtLeastOne = 5
    # How watches (re)list: "auto" streams the list (a watch with sendInitialEvents, the
    # apiserver's WatchList) and falls back to a paged LIST if the server refuses it; "on"
    # always streams (a refusal is a failed list, retried); "off" always pages with LIST.
    streaming_list: Literal["auto", "on", "off"] = "auto"
    # The most a response body may decode to (gzip: 127 KiB on the wire can be 128 MiB), and one
    # watch event: past either, the request fails (a watch relists) instead of growing.
    max_response_bytes: Annotated[int, count(ge=1 << 20, rule="must be >= 1048576 (1 MiB)")] = (
        64 << 20
    )
    max_event_bytes: Annotated[int, count(ge=1 << 20, rule="must be >= 1048576 (1 MiB)")] = 16 << 20
    # A watch that broke (an apiserver restart breaks every agent's at once) first reconnects
    # after a random 0..this many seconds, so the agents do not come back all together.
    # At most a minute: longer would leave a watch closed that long after a mere network blip.
    watch_reconnect_spread: Annotated[
        float, msgspec.Meta(ge=0, le=60, extra={RULE: "must be in 0..60 (seconds)"})
    ] = 5.0

    def validate(self) -> None:
        if self.kubeconfig is not None and not self.kubeconfig:
            raise ConfigError("kube.kubeconfig", self.kubeconfig, "must be a path or unset")
        if self.context is not None and not self.context:
            raise ConfigError("kube.context", self.context, "must be a name or unset")
        if self.kubeconfig is not None and self.in_cluster == "always":
            raise ConfigError(
                "kube.in_cluster", self.in_cluster, "cannot be 'always' with a kubeconfig"
            )
        # qps: a rate: inf would be no limit at all, 1e-9 one request in 30 years.
        # watch_inactivity_timeout: bookmarks come about every 60 s, a shorter timeout would
        # cut healthy idle watches.
        check_constraints(self, "kube")
        check_seconds("kube.request_timeout", self.request_timeout)


def load_client(
    settings: KubeSettings,
    *,
    environ: dict[str, str] | None = None,
    sa_dir: Path = SERVICE_ACCOUNT_DIR,
    dry_run: DryRun | None = None,
) -> KubeClient | None:
    """The client the settings describe, or None for standalone mode (no kubeconfig and not
    in a pod). Raises `ConfigError` for a kubeconfig that cannot be used. The client is not
    connected yet: enter it with ``async with``. ``dry_run``: the client's writes are dry runs
    recorded there."""
    settings.validate()
    env = dict(os.environ) if environ is None else environ
    if settings.kubeconfig is not None:
        config = load_kubeconfig(settings.kubeconfig, settings.context)
    elif settings.in_cluster != "never" and in_cluster_available(env):
        config = in_cluster_config(env, sa_dir)
    elif settings.in_cluster == "always":
        raise ConfigError("kube.in_cluster", "always", "KUBERNETES_SERVICE_HOST/PORT are not set")
    else:
        return None
    return KubeClient(
        config,
        qps=settings.qps,
        burst=settings.burst,
        request_timeout=settings.request_timeout,
        watch=WatchOptions(
            inactivity_timeout=settings.watch_inactivity_timeout,
            streaming_list=settings.streaming_list,
            max_event_bytes=settings.max_event_bytes,
            reconnect_spread=settings.watch_reconnect_spread,
        ),
        max_attempts=settings.max_attempts,
        max_response_bytes=settings.max_response_bytes,
        dry_run=dry_run,
    )
