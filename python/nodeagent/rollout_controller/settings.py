"""The rollout controller's settings (its command-line flags, docs/operating/cli.md)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodeagent.core.errors import ConfigError
from nodeagent.kube import KubeClient, KubeSettings, load_client

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

LEASE_NAME = "nodeagent-rollout-controller"


def default_namespace(
    environ: dict[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR
) -> str:
    """$POD_NAMESPACE, else the pod's own namespace (its service account's), else "default"."""
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return (sa_dir / "namespace").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: Literal["auto", "never", "always"] = "auto"
    # The Lease's namespace and name, and this candidate's name in it.
    namespace: str = "default"
    lease_name: str = LEASE_NAME
    identity: str = ""
    # client-go leaderelection's durations (seconds): a lease not renewed for lease_duration
    # may be taken over; a leader that could not renew for renew_deadline stops writing;
    # candidates try and leaders renew every retry_period.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # At most one status write per object per this many seconds (coalesced).
    write_interval: float = 1.0
    # HOST:PORT of /metrics and /healthz; "" serves nothing.
    metrics_address: str = "0.0.0.0:9465"
    qps: float = 20.0
    burst: int = 40

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", socket.gethostname())
        if not self.namespace:
            raise ConfigError("--namespace", self.namespace, "must be a namespace name")
        for flag, value in (
            ("--lease-duration", self.lease_duration),
            ("--renew-deadline", self.renew_deadline),
            ("--retry-period", self.retry_period),
        ):
            if not value > 0:
                raise ConfigError(flag, value, "must be > 0 (seconds)")
        # client-go's checks (leaderelection.NewLeaderElector): a leader must give up before a
        # follower may take over, and retry within its deadline.
        if not self.lease_duration > self.renew_deadline:
            raise ConfigError(
                "--lease-duration", self.lease_duration, "must be greater than --renew-deadline"
            )
        if not self.renew_deadline > self.retry_period:
            raise ConfigError(
                "--renew-deadline", self.renew_deadline, "must be greater than --retry-period"
            )
        if self.write_interval < 0:
            raise ConfigError("--write-interval", self.write_interval, "must be >= 0 (seconds)")
        if self.metrics_address and ":" not in self.metrics_address:
            raise ConfigError("--metrics-address", self.metrics_address, "must be HOST:PORT")

    def client(self) -> KubeClient | None:
        """The API client (not entered yet), or None without a cluster (no kubeconfig and not
        in a pod). ConfigError for a kubeconfig that cannot be used."""
        return load_client(
            KubeSettings(
                kubeconfig=self.kubeconfig,
                context=self.context,
                in_cluster=self.in_cluster,
                qps=self.qps,
                burst=self.burst,
            )
        )
