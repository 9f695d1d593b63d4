"""`nodeagent rollout-controller`'s flags: the chart passes them (keep them stable), bad values
and a missing cluster exit 2 with the flag named, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent import cli
from nodeagent.rollout_controller.settings import LEASE_NAME, default_namespace


def test_the_flags_the_chart_passes_parse() -> None:
    args = cli.build_parser().parse_args(
        [
            "rollout-controller",
            "--namespace=nodeagent",
            "--identity=pod-1",
            "--lease-name=nodeagent-rollout-controller",
            "--metrics-address=0.0.0.0:9465",
            "--lease-duration=6",
            "--renew-deadline=4",
            "--retry-period=0.5",
            "--write-interval=0.2",
        ]
    )
    assert (args.namespace, args.identity, args.lease_name) == ("nodeagent", "pod-1", LEASE_NAME)
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (6.0, 4.0, 0.5)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--lease-duration=5"], "--lease-duration"),  # not above --renew-deadline (10)
        (["--retry-period=10"], "--renew-deadline"),  # not above --retry-period
        (["--retry-period=0"], "--retry-period"),
        (["--write-interval=-1"], "--write-interval"),
        (["--metrics-address=9465"], "--metrics-address"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["rollout-controller", "--in-cluster=never", *flags]) == cli.EXIT_CONFIG
    assert named in capsys.readouterr().err


def test_no_cluster_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rollout-controller", "--in-cluster=never"]) == cli.EXIT_CONFIG
    assert "needs a cluster" in capsys.readouterr().err


def test_the_lease_namespace_defaults_to_the_pods(tmp_path: Path) -> None:
    assert default_namespace({"POD_NAMESPACE": "a"}, tmp_path) == "a"
    assert default_namespace({}, tmp_path) == "default"
    (tmp_path / "namespace").write_text("b\n")
    assert default_namespace({}, tmp_path) == "b"
