"""The `nodeagent` command line: run, check-config, status, rollout-controller."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from nodeagent import __version__
from nodeagent.config.loader import DEFAULT_CONFIG_PATH, Override, parse_set
from nodeagent.core.errors import ConfigError
from nodeagent.log import escape_control
from nodeagent.service.config import ConfigBuilder, computed_defaults, load_config

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_CONFIG = 2
# What a shell reports for a Unix tool killed by SIGPIPE (`nodeagent status | head -1`).
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE

# flag -> (TOML key, help)
_FLAG_KEYS: dict[str, tuple[str, str]] = {
    "kubeconfig": (
        "kube.kubeconfig",
        "kubeconfig file; without one (and outside a pod) run standalone",
    ),
    "node_name": ("agent.node_name", "node name (default: $NODE_NAME, else the hostname)"),
    "state_dir": (
        "agent.state_dir",
        "state directory (default: /var/lib/nodeagent as root, else "
        "$XDG_STATE_HOME/nodeagent or ~/.local/state/nodeagent)",
    ),
    "registry_dir": (
        "plugins.registry_dir",
        "plugin registry directory (default: <state_dir>/plugins_registry)",
    ),
    "ops_address": ("ops.address", "ops endpoint HOST:PORT (default 127.0.0.1:9464)"),
    "log_level": ("agent.log_level", "debug, info, warning or error"),
    "log_format": ("agent.log_format", "text or json"),
}


def _config_flags() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("configuration (flags override the file)")
    group.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML config file (default {DEFAULT_CONFIG_PATH}; absent default = defaults)",
    )
    for dest, (_, text) in _FLAG_KEYS.items():
        group.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar="VALUE", help=text)
    group.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config field; VALUE is a TOML literal (repeatable)",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodeagent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    flags = _config_flags()
    run = sub.add_parser("run", parents=[flags], help="run the agent in the foreground")
    run.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="send every write with dryRun=All and persist nothing; `nodeagent status` shows "
        "the writes the agent would have made (same as agent.dry_run = true)",
    )
    check = sub.add_parser(
        "check-config",
        parents=[flags],
        help="validate a config file and print the effective config",
    )
    check.add_argument("file", nargs="?", metavar="FILE", help="config file (same as --config)")
    check.add_argument("--format", choices=["toml", "json"], default="toml")
    status = sub.add_parser("status", help="show a running agent's components and plugins")
    status.add_argument(
        "--ops-address",
        metavar="HOST:PORT",
        help="the agent's ops endpoint (default: ops.address from --config, else 127.0.0.1:9464)",
    )
    status.add_argument("--config", metavar="FILE", help="read ops.address from this config file")
    status.add_argument("--json", action="store_true", help="print the raw JSON views")
    status.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout in seconds")
    _rollout_controller_flags(
        sub.add_parser(
            "rollout-controller",
            help="run the rollout controller (NodeAgentConfigs with spec.rollout, in waves)",
        )
    )
    return parser


def _rollout_controller_flags(cmd: argparse.ArgumentParser) -> None:
    """`nodeagent rollout-controller`'s flags (docs/operating/cli.md); the chart's Deployment
    passes them, so they stay stable."""
    cmd.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    cmd.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    cmd.add_argument(
        "--in-cluster",
        choices=["auto", "never", "always"],
        default="auto",
        help="use the pod's service account when no kubeconfig is given (as kube.in_cluster)",
    )
    cmd.add_argument(
        "--namespace",
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, else the pod's, else default)",
    )
    cmd.add_argument(
        "--lease-name", metavar="NAME", default="nodeagent-rollout-controller", help="the Lease"
    )
    cmd.add_argument(
        "--identity", metavar="NAME", help="this candidate's name in the Lease (default: hostname)"
    )
    for flag, default, text in (
        ("--lease-duration", 15.0, "seconds a follower waits on a lease not renewed"),
        ("--renew-deadline", 10.0, "seconds a leader that cannot renew keeps writing"),
        ("--retry-period", 2.0, "seconds between tries and renewals"),
        ("--write-interval", 1.0, "least seconds between two status writes of one object"),
    ):
        cmd.add_argument(flag, type=float, default=default, metavar="SECONDS", help=text)
    cmd.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        default="0.0.0.0:9465",
        help="serve /metrics and /healthz here ('' for none)",
    )
    cmd.add_argument("--qps", type=float, default=20.0, help="API requests per second (bucket)")
    cmd.add_argument("--burst", type=int, default=40, help="API request burst")
    cmd.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    cmd.add_argument("--log-format", default="text", choices=["text", "json"])


def overrides_from_args(args: argparse.Namespace) -> list[Override]:
    out = [
        Override(key, getattr(args, dest), "--" + dest.replace("_", "-"))
        for dest, (key, _) in _FLAG_KEYS.items()
        if getattr(args, dest, None) is not None
    ]
    if getattr(args, "dry_run", None):
        out.append(Override("agent.dry_run", True, "--dry-run"))
    return out + [parse_set(text) for text in args.sets]


def _error(message: str) -> None:
    """One line on stderr; file contents and agent replies in it are shown escaped."""
    print(escape_control(f"nodeagent: {message}"), file=sys.stderr)


def _output(text: str) -> None:
    """Write to stdout now: a closed pipe fails here (BrokenPipeError), not at exit."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _config_failure(exc: ConfigError) -> int:
    _error(f"invalid configuration: {exc}")
    return EXIT_CONFIG


def cmd_check_config(args: argparse.Namespace) -> int:
    from nodeagent.config.render import to_json, to_toml

    try:
        config, source = load_config(args.file or args.config, overrides_from_args(args))
    except ConfigError as exc:
        return _config_failure(exc)
    print(f"# effective configuration from {source or 'defaults'}", file=sys.stderr)
    _output(
        to_json(config) if args.format == "json" else to_toml(config, computed_defaults(config))
    )
    return EXIT_OK


def _hold_signals() -> list[int]:
    """From now until the agent's own receiver takes over, a SIGHUP (a reload sent while the
    agent starts) or a SIGTERM (a stop) is recorded instead of killing the process (the default
    actions, rc 129 and 143): the agent then ignores the reload and stops cleanly, so a stop
    right after a start that resumed a trial is a clean stop, never taken for a crash."""
    held: list[int] = []
    for signum in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: held.append(signum))
    return held


def cmd_run(args: argparse.Namespace) -> int:
    early_signals = _hold_signals()
    try:
        config, source = load_config(args.config, overrides_from_args(args))
    except ConfigError as exc:
        return _config_failure(exc)

    # Imported late: `check-config` and `status` stay fast and light.
    import prometheus_client
    import trio

    from nodeagent.core.component import FatalError
    from nodeagent.log import configure_logging, get_logger, stderr_is_journal
    from nodeagent.service.agent import Agent, prepare_state_dir
    from nodeagent.service.state_lock import lock_state_dir
    from nodeagent.service.supervisor import describe, find_fatal

    # journald understands "<N>" priority prefixes; a terminal or a pipe does not.
    configure_logging(
        config.agent.log_level,
        config.agent.log_format,
        priority_prefix=stderr_is_journal(),
    )
    # *_created series double every counter's exposition for no use on a node agent.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    log = get_logger("nodeagent")
    log.info("configuration loaded", source=source or "defaults", version=__version__)
    overrides = overrides_from_args(args)
    # SIGHUP re-reads the same file with the same flags and validation.
    try:
        builder = ConfigBuilder(args.config, overrides)
    except ConfigError as exc:
        return _config_failure(exc)
    try:
        # Before the agent reads its checkpoints there: an unusable state dir is a FatalError
        # naming it (exit 1), not a traceback or a component that never gets ready.
        prepare_state_dir(config.agent.state_dir)
        # One agent per state dir, held until the process ends (the kernel releases it, also
        # after a kill). A dry run persists nothing there: it runs beside the agent (a canary)
        # without the lock, and never keeps the real one from starting. Held by this frame.
        if not config.agent.dry_run:
            _lock = lock_state_dir(config.agent.state_dir, config.agent.node_name)
        agent = Agent(
            config, reloader=lambda: load_config(args.config, overrides)[0], builder=builder
        )
        agent.early_signals = early_signals
        trio.run(agent.run)
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were installed
        return 130
    except ConfigError as exc:  # found while starting, e.g. an unusable kubeconfig
        return _config_failure(exc)
    except FatalError as exc:
        log.error("fatal error", error=str(exc))
        return EXIT_FATAL
    except BaseException as exc:
        fatal = find_fatal(exc)
        if fatal is not None:
            log.error("fatal error", error=str(fatal))
            return EXIT_FATAL
        if not isinstance(exc, Exception):
            raise
        log.exception("agent crashed", error=describe(exc))
        return EXIT_FATAL
    return EXIT_OK if agent.shutdown_complete else EXIT_FATAL


def _status_address(args: argparse.Namespace) -> str:
    if args.ops_address:
        return str(args.ops_address)
    try:
        config, _ = load_config(args.config)
    except ConfigError as exc:
        _error(f"ignoring invalid configuration ({exc})")
        return "127.0.0.1:9464"
    return config.ops.address


def cmd_status(args: argparse.Namespace) -> int:
    import urllib.request

    from nodeagent.service import cli_view

    address = _status_address(args)
    # The ops endpoint is the node's own: never through http_proxy/HTTPS_PROXY (common on
    # nodes), which would report a running agent unreachable. urlopen uses this opener.
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))
    try:
        doc = cli_view.fetch(address, "/v1/status", args.timeout)
        plugins = cli_view.fetch(address, "/v1/plugins", args.timeout)
    except cli_view.Unreachable as exc:
        _error(f"cannot reach the agent's ops endpoint: {exc}")
        return cli_view.EXIT_UNREACHABLE
    try:
        writes = cli_view.fetch(address, "/v1/writes", args.timeout)
    except cli_view.Unreachable:
        writes = None  # an agent from before the dry run: it writes for real
    # What plugins sent (names, errors) is shown escaped: JSON escapes controls itself but for
    # DEL; the table escapes every cell and, here, everything else but its own line breaks.
    if args.json:
        views = {"status": doc, "plugins": plugins}
        if writes is not None:
            views["writes"] = writes
        text = json.dumps(views, indent=2) + "\n"
        _output(text.replace("\x7f", "\\u007f"))
    else:
        _output(escape_control(cli_view.render(doc, plugins) + render_writes(writes), keep="\n"))
    return cli_view.exit_code(doc)


def render_writes(view: Any) -> str:
    """The dry run's section of `nodeagent status` ("" for an agent that writes for real):
    each would-be write with the paths its diff changes (+ added, - removed, ~ replaced);
    the whole diffs are in ``--json`` and /v1/writes."""
    if not isinstance(view, dict) or not view.get("dry_run"):
        return ""
    from nodeagent.service.cli_view import table

    writes = [w for w in view.get("writes") or [] if isinstance(w, dict)]
    head = (
        f"\nDRY RUN: nothing is written. {view.get('total', 0)} writes the agent would have "
        f"made ({view.get('older', 0)} older not kept, {view.get('repeated', 0)} repeats "
        "answered from memory); diffs: --json or /v1/writes\n"
    )
    if not writes:
        return head
    marks = {"add": "+", "remove": "-", "replace": "~"}
    rows = []
    for w in writes:
        obj = w.get("object") or {}
        where = "/".join(p for p in (obj.get("namespace"), obj.get("name")) if p)
        ops = [op for op in w.get("diff") or [] if isinstance(op, dict)]
        changes = " ".join(
            f"{marks.get(str(op.get('op')), '?')}{op.get('path') or '/'}" for op in ops
        )
        if w.get("diff_omitted"):
            changes += f" (+{w['diff_omitted']} more)"
        rows.append([w.get("time"), w.get("verb"), obj.get("kind"), where, changes])
    return head + "\n" + table(["TIME", "VERB", "KIND", "OBJECT", "CHANGES"], rows) + "\n"


def cmd_rollout_controller(args: argparse.Namespace) -> int:
    import prometheus_client
    import trio

    from nodeagent.log import configure_logging, get_logger
    from nodeagent.rollout_controller.controller import main as controller_main
    from nodeagent.rollout_controller.settings import ControllerSettings, default_namespace

    settings = ControllerSettings(
        kubeconfig=args.kubeconfig,
        context=args.context,
        in_cluster=args.in_cluster,
        namespace=args.namespace or default_namespace(),
        lease_name=args.lease_name,
        identity=args.identity or "",
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        write_interval=args.write_interval,
        metrics_address=args.metrics_address,
        qps=args.qps,
        burst=args.burst,
    )
    client = settings.client()
    if client is None:
        _error("rollout-controller needs a cluster: --kubeconfig, or run in a pod")
        return EXIT_CONFIG
    configure_logging(args.log_level, args.log_format)
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    log = get_logger("nodeagent.rollout_controller")
    log.info(
        "rollout controller starting",
        version=__version__,
        identity=settings.identity,
        lease=f"{settings.namespace}/{settings.lease_name}",
    )
    try:
        trio.run(controller_main, settings, client)
    except KeyboardInterrupt:  # a Ctrl-C before the signal receiver was installed
        return 130
    return EXIT_OK  # SIGTERM or SIGINT: stopped, the Lease released


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    try:
        commands = {
            "run": cmd_run,
            "check-config": cmd_check_config,
            "status": cmd_status,
            "rollout-controller": cmd_rollout_controller,
        }
        return commands[args.command](args)
    except ConfigError as exc:  # e.g. a malformed --set
        return _config_failure(exc)
    except BrokenPipeError:
        # The reader left (`| head -1`): stop quietly with a Unix tool's status. stdout now
        # points at /dev/null so the interpreter's last flush cannot fail (and print) again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
