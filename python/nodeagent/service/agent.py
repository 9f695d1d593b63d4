"""The agent process: one Trio run rooted here.

Tree: signal watcher | main scope [ gRPC bridge [ heartbeat, ops endpoint, status loop,
supervisor [ plugins, kube, resources, ... ] ] ] | shutdown hooks. The one kube client (None:
standalone) is open around the supervisor, so components share it across their restarts.
The first SIGTERM/SIGINT cancels the main scope, then the hooks run (flush checkpoints) under
`agent.shutdown_timeout`; a timer thread enforces that deadline even if a cleanup hangs, and a
second signal exits at once.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nodeagent import __version__
from nodeagent.checkpoint import CheckpointStore
from nodeagent.config.render import to_builtins
from nodeagent.core.component import Component, FatalError
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.component import DynconfigComponent, EventBuffer
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.overlay import config_hash
from nodeagent.kube import DryRun, EventRecorder, load_client
from nodeagent.log import get_logger, set_log_level
from nodeagent.plugins import PluginManager
from nodeagent.reporter.component import ReporterComponent, cnr_summary
from nodeagent.resources.component import ResourcesComponent, slice_summary
from nodeagent.rpc.bridge import open_grpc_bridge
from nodeagent.service.cluster import ClusterComponent
from nodeagent.service.config import Config, ConfigBuilder
from nodeagent.service.confighub import ConfigHub
from nodeagent.service.heartbeat import Heartbeat
from nodeagent.service.metrics import BUILD_INFO, CONFIG_RELOADS
from nodeagent.service.ops import OpsServer
from nodeagent.service.sdnotify import SystemdNotifier
from nodeagent.service.settings import AgentSettings
from nodeagent.service.supervisor import ComponentReport, Supervisor
from nodeagent.service.views import config_document

log = get_logger(__name__)

# Seconds a worker thread (large inventories are converted in one) may hold the GIL before the
# event loop gets it back; CPython's default of 5 ms shows up directly as loop lag.
LOOP_SWITCH_INTERVAL = 0.001

EXIT_SHUTDOWN_TIMEOUT = 1
# Past the deadline the hooks are cut short; this much later a thread ends a process whose loop
# could not even get there (stuck loop, shielded cleanup that never returns).
HARD_EXIT_GRACE = 2.0
ShutdownHook = Callable[[], Awaitable[None]]
# Re-reads the config file (and flags) with the start-up validation; raises ConfigError.
Reloader = Callable[[], Config]


def _hard_exit(code: int, message: str) -> None:
    # Runs in a thread or a signal path: no logging machinery, no Trio.
    sys.stderr.write(f"<2>nodeagent: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def prepare_state_dir(path: str) -> None:
    """Create the state dir (0700) if needed and prove it writable by writing a file in it:
    permission bits say nothing to root, a read-only mount or a full disk only show on write.
    FatalError (exit 1) naming the directory and the reason otherwise."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError as exc:
        raise FatalError(f"agent.state_dir {path} exists and is not a directory") from exc
    except OSError as exc:
        raise FatalError(f"cannot create agent.state_dir {path}: {exc.strerror or exc}") from exc
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
    except OSError as exc:
        raise FatalError(f"agent.state_dir {path} is not writable: {exc.strerror or exc}") from exc
    os.close(fd)
    os.unlink(probe)


class Agent:
    """The process: owns the configuration, the shared resources and the root of the task tree.

    It builds the gRPC bridge, the one kube client (`ClusterComponent`; None: standalone), the
    plugin manager, the publisher component and the `Supervisor` over them, and runs heartbeat,
    ops endpoint and supervisor as siblings in one nursery, so nothing outlives `run()`. Shared
    resources (bridge, client) are opened around the supervisor and survive component restarts.
    `run()` returns after a signal or `request_shutdown`: the main scope is cancelled, then the
    shutdown hooks run under `agent.shutdown_timeout`, with a thread as the hard deadline. The
    agent is also the ops endpoint's `AgentView` (liveness, readiness, plugins, slices, config).
    """

    def __init__(
        self,
        config: Config,
        *,
        notifier: SystemdNotifier | None = None,
        extra_components: Sequence[Component] = (),
        cluster: ClusterComponent | None = None,
        reloader: Reloader | None = None,
        builder: ConfigBuilder | None = None,
    ) -> None:
        # agent.dry_run (static): writes go with dryRun=All and are recorded here, checkpoints
        # are read but not written.
        self.dry_run = DryRun() if config.agent.dry_run else None
        if self.dry_run is not None:
            log.warning(
                "dry run: every write is sent with dryRun=All and nothing is persisted; "
                "the writes this agent would make are on /v1/writes"
            )
        # With a builder (file + flags + remote overlay), dynamic configuration is on: the
        # controller boots first, so a checkpointed last-known-good runs from the start, also
        # without the apiserver.
        self.builder = builder if config.dynconfig.enabled else None
        # The process's one Event recorder: it keeps what is recorded (a rollback at boot)
        # until the one client exists, and every component posts through it.
        self.events = EventRecorder(config.agent.node_name)
        self.dynconfig_events = EventBuffer(self.events)
        self.controller: Controller[Config] | None = None
        if self.builder is None:
            self.hub = ConfigHub(config)
        else:
            store = CheckpointStore(
                Path(config.agent.state_dir) / "checkpoints",
                node=config.agent.node_name,
                read_only=config.agent.dry_run,
            )
            # Where the state goes while the checkpoint cannot be written (dynconfig.state).
            runtime = (
                CheckpointStore(
                    Path(config.agent.runtime_dir),
                    node=config.agent.node_name,
                    read_only=config.agent.dry_run,
                )
                if config.agent.runtime_dir
                else None
            )
            booted = boot(config.dynconfig, store, self.builder, runtime=runtime)
            self.hub = ConfigHub(booted.config)
            self.controller = Controller(
                config.dynconfig,
                store,
                self.builder,
                config_hash,
                self.hub,
                booted,
                on_event=self.dynconfig_events,
                file_hash=self.builder.file_hash,
                on_file_rollback=lambda message: self._reloaded("rolled_back", message),
                runtime=runtime,
            )
        self.dynconfig_component: DynconfigComponent | None = None
        self.hub.agent.subscribe(on_applied=_apply_log_level, name="log")
        self.reloader = reloader
        # SIGHUPs that came before `run` installed its signal receiver (the CLI appends them).
        # SIGHUP and SIGTERM the CLI held from its first line until run() took over.
        self.early_signals: list[int] = []
        self.last_reload: dict[str, Any] | None = None
        self.notifier = notifier or SystemdNotifier.from_env()
        self.heartbeat = Heartbeat(
            config.agent.heartbeat_interval,
            self.notifier,
            stale_after=config.agent.healthz_stale_after,
        )
        self.ops = OpsServer(config.ops, self, dry_run=self.dry_run)
        self.cluster = cluster or ClusterComponent(
            config.kube,
            load_client=partial(load_client, dry_run=self.dry_run),
            probe_interval=config.agent.cluster_probe_interval,
            unreachable_bound=config.agent.apiserver_unreachable_bound,
        )
        self.extra_components = list(extra_components)
        self.supervisor: Supervisor | None = None
        self.plugin_manager: PluginManager | None = None
        self.resources_component: ResourcesComponent | None = None
        self.reporter_component: ReporterComponent | None = None
        self.shutdown_hooks: list[ShutdownHook] = []
        self.shutdown_complete = True
        self.started_wall = time.time()
        self.started_at: float | None = None
        self._main_scope = trio.CancelScope()
        self._shutdown_started = False
        self._hard_timer: threading.Timer | None = None
        self._deadline: float | None = None

    @property
    def config(self) -> Config:
        """The running configuration (hot changes included)."""
        return self.hub.current

    def add_shutdown_hook(self, hook: ShutdownHook) -> None:
        """Called after the components are cancelled, in order, within the shutdown deadline."""
        self.shutdown_hooks.append(hook)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until a signal (or `request_shutdown`); `shutdown_complete` tells whether every
        shutdown hook finished within the deadline."""
        # Static-configuration problems (an unusable kubeconfig) surface before anything starts.
        self.cluster.preflight()
        prepare_state_dir(self.config.agent.state_dir)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            sighups = self.early_signals.count(signal.SIGHUP)
            if sighups:
                # Held by the CLI from its first line until this receiver took over.
                log.warning(
                    "SIGHUP received while starting, before reloads were possible: ignored "
                    "(the configuration in use was read at start)",
                    count=sighups,
                )
            if signal.SIGTERM in self.early_signals:
                # A stop asked for while starting: as clean as one asked for later (the main
                # scope is cancelled before it is entered, the hooks and stop_clean still run).
                self.request_shutdown("SIGTERM (received while starting)")
            async with trio.open_nursery() as outer:
                outer.start_soon(self._watch_signals, signals)
                with self._main_scope:
                    await self._serve()
                if self._shutdown_started and self.controller is not None:
                    # Stopped on request with nothing running any more: a trial under way is
                    # resumed at the next start, not taken for a crash (a failure exit never
                    # gets here, and a kill -9 never runs it: both still roll back).
                    self.controller.stop_clean()
                await self._run_shutdown_hooks()
                outer.cancel_scope.cancel()
        if self._hard_timer is not None:
            self._hard_timer.cancel()
        log.info("stopped")

    def request_shutdown(self, reason: str) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        timeout = self.config.agent.shutdown_timeout
        log.info("shutting down", reason=reason, timeout=timeout)
        self.notifier.stopping(f"stopping: {reason}")
        self._hard_timer = threading.Timer(
            timeout + HARD_EXIT_GRACE,
            _hard_exit,
            (EXIT_SHUTDOWN_TIMEOUT, f"shutdown did not finish within {timeout:g}s; exiting"),
        )
        self._hard_timer.daemon = True
        self._hard_timer.start()
        self._deadline = trio.current_time() + timeout
        self._main_scope.cancel()

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if self._shutdown_started:
                    # `systemctl reload` racing a stop: a reload now could start a trial that
                    # the stop then records as interrupted, for a file nobody saw run.
                    log.warning("SIGHUP during shutdown: ignored, no reload")
                    continue
                self.reload()
                continue
            if self._shutdown_started:
                _hard_exit(128 + signum, f"second {name}: exiting immediately")
            self.request_shutdown(name)

    def reload(self) -> None:
        """Re-read the config file and propose it; anything wrong keeps the running config and
        is logged, counted and shown in /v1/status (`config_reload`)."""
        if self.controller is not None and self.builder is not None:
            # On trial like a remote change, under the active remote overlay (which stays);
            # a rollback reports through `on_file_rollback`.
            try:
                undo = self.builder.reread()
            except ConfigError as exc:
                self._reloaded("invalid", str(exc))
                return
            self._reloaded(
                *self.controller.propose_local(self.builder.file_hash, undo, self.readiness())
            )
            return
        if self.reloader is None:
            self._reloaded("unsupported", "no config file to re-read (started without reload)")
            return
        # dynconfig.enabled = false: applied directly, without a trial.
        try:
            new = self.reloader()
        except ConfigError as exc:
            self._reloaded("invalid", str(exc))
            return
        result = self.hub.propose(new, "SIGHUP")
        if not result.applied:
            self._reloaded("refused", result.reason())
        elif result.changed:
            self._reloaded("applied", "changed: " + ", ".join(result.changed))
        else:
            self._reloaded("unchanged", "no field changed")

    def _reloaded(self, result: str, message: str) -> None:
        CONFIG_RELOADS.labels(result=result).inc()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.last_reload = {"result": result, "message": message, "time": at}
        if result in ("applied", "unchanged"):
            log.info("config reloaded", result=result, message=message)
        elif result == "rolled_back":
            log.error("reloaded config rolled back after its trial", error=message)
        else:
            log.error("config reload failed; running config kept", result=result, error=message)

    async def _serve(self) -> None:
        async with open_grpc_bridge() as bridge, self.cluster.connected() as client:
            self.plugin_manager = manager = PluginManager(self.hub.plugins, bridge)
            agent = self.config.agent
            self.resources_component = ResourcesComponent(
                node_name=agent.node_name,
                inventories=manager.channel("DRAPlugin"),
                settings=self.hub.resources,
                accumulator_settings=self.config.accumulator,
                client=client,
                events=self.events,
            )
            self.reporter_component = ReporterComponent(
                node_name=agent.node_name,
                plugins=manager.channel("ReporterPlugin"),
                settings=self.hub.reporter,
                accumulator_settings=self.config.accumulator,
                state_dir=agent.state_dir,
                client=client,
                events=self.events,
                dry_run=self.dry_run is not None,
            )
            dynamic: list[Component] = []
            if self.controller is not None and client is not None:
                self.dynconfig_component = DynconfigComponent(
                    node_name=agent.node_name,
                    controller=self.controller,
                    events=self.dynconfig_events,
                    client=client,
                    accumulator_settings=self.config.accumulator,
                    reports=self.readiness,
                    watchdog_age=lambda: self.heartbeat.liveness()[1],
                    # The watches' answers confirm a quiet assignment only while the apiserver
                    # answers (kube ready: connected, or lost for less than its bound).
                    answering=lambda: self.cluster.readiness()[0],
                )
                dynamic.append(self.dynconfig_component)
            self.supervisor = Supervisor(
                [
                    manager,
                    self.cluster,
                    self.resources_component,
                    self.reporter_component,
                    *dynamic,
                    *self.extra_components,
                ],
                backoff_initial=agent.restart_backoff_initial,
                backoff_max=agent.restart_backoff_max,
                reset_after=agent.restart_backoff_reset_after,
            )
            async with trio.open_nursery() as root:
                if client is not None:
                    self.events.attach(client)
                    root.start_soon(self.events.run)
                else:
                    self.events.off()
                await root.start(self.heartbeat.run)
                if self.config.ops.enabled:
                    await root.start(self.ops.run)
                await root.start(self.supervisor.run)
                if self.controller is not None and self.dynconfig_component is None:
                    # Standalone (or no CRD client): the trials of reloaded files still run;
                    # outcomes are logged, counted and shown in status (no condition, no Event).
                    root.start_soon(
                        self.controller.run_trials,
                        self.readiness,
                        lambda: self.heartbeat.liveness()[1],
                    )
                self.started_at = trio.current_time()
                BUILD_INFO.info(
                    {
                        "version": __version__,
                        "python": sys.version.split()[0],
                        "mode": self.cluster.mode,
                    }
                )
                # Everything alive now (modules, settings, the first state) lives as long as the
                # process: keep it out of every later full collection, whose pauses would
                # otherwise grow with the code loaded and show as event-loop lag.
                gc.freeze()
                sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
                summary = self._summary()
                self.notifier.ready(summary)
                log.info(
                    "started",
                    node=agent.node_name,
                    mode=self.cluster.mode,
                    ops=self.ops.address or "disabled",
                    status=summary,
                )
                root.start_soon(self._status_loop, summary)

    async def _status_loop(self, last: str) -> None:
        while True:
            await trio.sleep(self.config.agent.heartbeat_interval)
            summary = self._summary()
            if summary != last:
                self.notifier.status(summary)
                log.info("status changed", status=summary)
                last = summary

    def _summary(self) -> str:
        reports = self.readiness()
        waiting = [f"{r.name} ({r.reason})" for r in reports if not r.ready]
        ops = f"; ops on {self.ops.address}" if self.ops.address else ""
        mode = self.cluster.mode
        if waiting:
            return f"{mode}; not ready: " + ", ".join(waiting) + ops
        return f"{mode}; ready ({len(reports)} components){ops}"

    async def _run_shutdown_hooks(self) -> None:
        if not self.shutdown_hooks:
            return
        deadline = self._deadline
        if deadline is None:  # the main scope ended without a shutdown request
            deadline = trio.current_time() + self.config.agent.shutdown_timeout
        with trio.move_on_at(deadline) as scope:
            for hook in self.shutdown_hooks:
                try:
                    await hook()
                except Exception as exc:
                    log.exception("shutdown hook failed", hook=repr(hook), error=str(exc))
        if scope.cancelled_caught:
            self.shutdown_complete = False
            log.error(
                "shutdown hooks cut short by the deadline",
                timeout=self.config.agent.shutdown_timeout,
            )

    # -- AgentView (what the ops endpoint shows) ---------------------------------------------

    def liveness(self) -> tuple[bool, float | None]:
        return self.heartbeat.liveness()

    def readiness(self) -> list[ComponentReport]:
        return self.supervisor.report() if self.supervisor is not None else []

    def plugins(self) -> list[dict[str, Any]]:
        if self.plugin_manager is None:
            return []
        return self.plugin_manager.status()

    def resourceslices(self) -> dict[str, Any]:
        if self.resources_component is None:
            return {"node": self.config.agent.node_name, "mode": self.cluster.mode, "drivers": {}}
        return self.resources_component.view()

    def cnr(self) -> dict[str, Any]:
        if self.reporter_component is None:
            return {"node": self.config.agent.node_name, "mode": self.cluster.mode, "cnr": None}
        return self.reporter_component.view()

    def effective_config(self) -> dict[str, Any]:
        """/v1/config: the configuration in force and where it came from."""
        return config_document(to_builtins(self.config), self.dynconfig())

    def dynconfig(self) -> dict[str, Any] | None:
        """assigned / active / last-known-good and why they differ (None: not enabled)."""
        if self.dynconfig_component is not None:
            return self.dynconfig_component.view()
        if self.controller is not None:
            return dict(self.controller.status())
        return None

    def status(self) -> dict[str, Any]:
        reports = self.readiness()
        uptime = trio.current_time() - self.started_at if self.started_at is not None else 0.0
        return {
            "version": __version__,
            "node": self.config.agent.node_name,
            "mode": self.cluster.mode,
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_wall)),
            "uptime_seconds": round(uptime, 3),
            "ready": all(r.ready for r in reports),
            "ops_address": self.ops.address,
            "state_dir": self.config.agent.state_dir,
            "registry_dir": self.config.plugins.registry_dir,
            "components": [r.to_json() for r in reports],
            "plugins": len(self.plugins()),
            "resourceslices": slice_summary(self.resourceslices()),
            "cnr": cnr_summary(self.cnr()),
            "config_reload": self.last_reload,
            "dynconfig": self.dynconfig(),
            "checkpoint_problems": self.checkpoint_problems(),
        }

    def checkpoint_problems(self) -> list[str]:
        """What the checkpoint stores last failed to do in the state directory (a read-only
        mount: a leftover not removed, a write not made); the agent runs on, on what it read."""
        stores = [
            self.controller.store if self.controller is not None else None,
            self.controller.runtime if self.controller is not None else None,
            self.reporter_component.checkpoints if self.reporter_component is not None else None,
        ]
        return sorted({s.problem for s in stores if s is not None and s.problem is not None})


def _apply_log_level(old: AgentSettings, new: AgentSettings) -> None:
    if old.log_level != new.log_level:
        set_log_level(new.log_level)
