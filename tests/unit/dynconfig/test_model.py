"""A model-based test of dynamic configuration: Hypothesis drives the real dynconfig component
(its two accumulators over in-memory watches, the real controller, a checkpoint directory on
disk) through any interleaving of node label changes, NodeAgentConfig objects created, edited,
made undecodable and deleted, relists of either query starting and ending (changes to a
relisting query arrive when its relist ends), trials judged unhealthy or surviving, clean
restarts (SIGTERM), crash restarts (kill -9), the checkpoint grace running out while the
agent is down and the checkpoint directory turning read-only and writable again (its writes
fail, as on a read-only or full disk: the state goes to the runtime directory, a new trial is
deferred), objects opting in to a rollout (``spec.rollout``) whose ``status.rollout`` the test
writes as the rollout controller would (none, this node's wave not yet, admitted, Complete,
Aborted: issue 31), and compares it after every step with a small reference model of what the
docs promise (docs/architecture/dynamic-config.md, docs/architecture/rollout.md).

The component runs in a Trio loop of its own thread, on a mock clock that only moves when a rule
moves it (`settle` lets every task run to a wait, moving the clock in small steps so that
coalescing and rechecks happen); the wall clock of the checkpoint grace is a settable one.

Invariants: the running config is the one the model chooses; last-known-good is only a config
that ran to the end of a trial (or the local one); the trial is the model's, and never has its
own config as last-known-good; the condition's reason is the model's once no relist is under way,
and the one written to the Node is the controller's; bad configs are the model's; what a restart
would read (the runtime copy, else the checkpoint) is the controller's state; the agent never
takes the config of a rollout object its status does not admit (but its own last-known-good,
taken back at once: the operator's fast undo), and never makes last-known-good a config whose
rollout is not Complete.
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, TypeVar, cast

import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.checkpoint import CheckpointStore
from nodeagent.checkpoint import store as store_module
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.component import DynconfigComponent, EventBuffer
from nodeagent.dynconfig.controller import RETRY_MAX, Controller
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import LOCAL_HASH, State, load, load_runtime
from nodeagent.kube import EventRecorder
from nodeagent.kube.watch import WatchSink
from nodeagent.rollout.rank import WAITING_FOR_CONTROLLER, WAITING_FOR_WAVE
from tests.support.fake_dynconfig import FakeHub, Report, Wall, build, hasher
from tests.support.nodeagentconfig import NAC
from tests.unit.accumulator.helpers import page
from tests.unit.dynconfig.test_component import NODE, Client
from tests.unit.dynconfig.test_read_only_state import Disk

T = TypeVar("T")

NAMES = ("a", "b", "c")
# What an object targets: this node by name, a pool by selector, or every node (global).
SHAPES = ("named", "pool-x", "pool-y", "global")
CONFIGS: tuple[dict[str, Any], ...] = (
    {"interval": 6},
    {"interval": 7},
    {"interval": 8},
    {"bogus": 1},  # a field the agent refuses: rejected as invalid
)
TRIAL = 1e6  # trial seconds: only the trial-end rule ends a trial, never the settling
GRACE = 7200.0
CRASHLOOP = 3
SETTINGS = DynconfigSettings(
    trial_duration=TRIAL,
    checkpoint_grace=GRACE,
    unready_bound=60.0,
    health_interval=5.0,
    crashloop_restarts=CRASHLOOP,
)
_uids = itertools.count(1)
# What the rollout controller last wrote in an object's status.rollout, for the config it had:
# this node beyond the threshold (the canary's keys only), everyone, Complete, Aborted.
ROLLOUT_STATES = ("wave", "admit", "complete", "abort")
_THROUGH = {"wave": "0-" + "f" * 64, "admit": "all", "complete": "all", "abort": "none"}
_PHASE = {"wave": "Progressing", "admit": "Progressing", "complete": "Complete", "abort": "Aborted"}


@dataclass
class Obj:
    name: str
    uid: str
    shape: str
    config: dict[str, Any]
    generation: int = 1
    rv: int = 1
    broken: bool = False  # fails to decode (a looser CRD let a bad field through)
    rollout: bool = False  # spec.rollout: {} (opted in to a rollout)
    # status.rollout: (the config hash it is about, one of ROLLOUT_STATES); None: none written.
    status: tuple[str, str] | None = None

    def raw(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"config": self.config}
        if self.shape == "named":
            spec["nodeNames"] = [NODE]
        elif self.shape.startswith("pool-"):
            spec["nodeSelector"] = {"matchLabels": {"pool": self.shape[5:]}}
        if self.broken:
            spec["priority"] = "high"
        if self.rollout:
            spec["rollout"] = {}
        meta = {
            "name": self.name,
            "uid": self.uid,
            "resourceVersion": str(self.rv),
            "generation": self.generation,
        }
        body: dict[str, Any] = {"metadata": meta, "spec": spec}
        if self.status is not None:
            hash_, state = self.status
            body["status"] = {
                "rollout": {
                    "configHash": hash_,
                    "generation": 1,
                    "phase": _PHASE[state],
                    "admittedThrough": _THROUGH[state],
                }
            }
        return body

    def said(self, state: str) -> bool:
        """Whether its status says `state` about its own config."""
        return self.status == (self.hash, state)

    @property
    def admitted(self) -> bool:
        """Whether this node may take its config (no rollout: at once)."""
        return not self.rollout or self.said("admit") or self.said("complete")

    @property
    def waiting(self) -> str:
        """The condition's reason while its rollout does not admit this node."""
        if self.said("abort"):
            return "RolloutAborted"
        return WAITING_FOR_WAVE if self.said("wave") else WAITING_FOR_CONTROLLER

    @property
    def hash(self) -> str:
        return hasher(self.config)

    @property
    def key(self) -> str:
        return f"{self.uid}/{self.generation}"


@dataclass
class Model:
    """What the docs promise, kept by hand."""

    active: str = LOCAL_HASH
    lkg: str | None = None
    trial: str | None = None
    trial_restarts: int = 0
    assigned: Obj | None = None  # a copy of the object last assigned
    bad: dict[str, str] = field(default_factory=dict)  # hash -> object key
    bad_reason: dict[str, str] = field(default_factory=dict)  # hash -> condition reason
    promoted: set[str] = field(default_factory=set)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # hash -> config
    condition: str = "Local"
    kept: str | None = None  # a selection that could not choose: its condition reason
    expired: bool = False  # the grace ran out since the apiserver last confirmed
    read_only: bool = False  # the checkpoint directory's writes fail
    deferred: Obj | None = None  # a config whose trial could not be recorded
    # A rollout's config through its trial, held short of last-known-good until Complete.
    passed: str | None = None
    trial_rollout: bool = False  # the config on trial is a rollout object's
    gated: bool = False  # a selection assigned since the start (the controller's `_gated`)


class Loop:
    """A Trio loop in a thread, on a mock clock, that runs the test's coroutines in order."""

    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()
        self._calls: queue.Queue[tuple[Callable[[], Awaitable[Any]], queue.Queue[Any]] | None]
        self._calls = queue.Queue()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        async def serve() -> None:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                while True:
                    item = await trio.to_thread.run_sync(self._calls.get)
                    if item is None:
                        nursery.cancel_scope.cancel()
                        return
                    fn, answer = item
                    try:
                        answer.put((True, await fn()))
                    except BaseException as exc:  # handed to the test's thread
                        answer.put((False, exc))

        trio.run(serve, clock=self.clock)

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        answer: queue.Queue[Any] = queue.Queue()
        self._calls.put((fn, answer))
        ok, value = answer.get(timeout=60)
        if not ok:
            raise value
        return cast(T, value)

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(30)


class Agent:
    """One agent process: a controller booted from the checkpoint and its component."""

    def __init__(
        self,
        loop: Loop,
        directory: Path,
        runtime_dir: Path,
        wall: Wall,
        ready: list[bool],
        answering: list[bool],
    ) -> None:
        self.client = Client()
        self.store = CheckpointStore(directory)
        self.runtime = CheckpointStore(runtime_dir)
        booted = boot(SETTINGS, self.store, build, wall=wall, runtime=self.runtime)
        self.hub = FakeHub(booted.config)
        self.controller: Controller[dict[str, Any]] = Controller(
            SETTINGS, self.store, build, hasher, self.hub, booted, wall=wall, runtime=self.runtime
        )
        self.component = DynconfigComponent(
            node_name=NODE,
            controller=self.controller,
            events=EventBuffer(EventRecorder(NODE)),
            client=cast(Any, self.client),
            accumulator_settings=AccumulatorSettings(max_interval=0.05),
            reports=lambda: [Report("publisher", ready=ready[0])],
            answering=lambda: answering[0],
            watch=self.client.run_watch,
        )
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()

        async def start() -> None:
            await loop.nursery.start(self._run)

        loop.run(start)

    async def _run(self, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            with self.scope:
                await self.component.run(task_status=task_status)
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()


class DynconfigModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = TemporaryDirectory(prefix="dynconfig-model-")
        self.directory = Path(self._tmp.name) / "checkpoints"
        self.runtime_dir = Path(self._tmp.name) / "run"
        # The checkpoint directory's writes fail while it is "read-only" (root ignores
        # permission bits): the store's write, patched for this directory only.
        self.disk = Disk()
        store_module._write_atomically = self.disk.write
        self.loop = Loop()
        self.wall = Wall()
        self.ready = [True]
        # Whether the apiserver answers: only while a trial's time passes (the one rule that
        # lets the quarter grace of the live assignment's confirmation go by).
        self.answering = [False]
        self.objects: dict[str, Obj] = {}
        self.labels: dict[str, str] = {"pool": "x"}
        self.node_rv = 1
        self.relisting: set[str] = set()  # plurals with a relist under way
        self.owed = True  # a change not selected yet (the first list is one)
        self.model = Model()
        # The controller's active and last-known-good hashes at the last check.
        self.seen_active: str = LOCAL_HASH
        self.seen_lkg: str | None = None
        self.agent = self._start()

    def teardown(self) -> None:
        try:
            self.loop.run(self.agent.stop)
        finally:
            store_module._write_atomically = self.disk._write
            self.loop.close()
            self._tmp.cleanup()

    # -- the world -------------------------------------------------------------------------

    def _start(self) -> Agent:
        agent = Agent(
            self.loop, self.directory, self.runtime_dir, self.wall, self.ready, self.answering
        )
        self.agent = agent
        self.relisting.clear()

        async def first_lists() -> None:
            await self._list("nodes")
            await self._list(NAC.plural)

        self.loop.run(first_lists)
        self.owed = True
        self._settle_and_select()
        return agent

    def _node(self) -> dict[str, Any]:
        meta = {"name": NODE, "uid": "n", "resourceVersion": str(self.node_rv)}
        return {"metadata": {**meta, "labels": self.labels}}

    async def _sink(self, plural: str) -> WatchSink:
        return await self.agent.client.sink(plural)

    async def _list(self, plural: str) -> None:
        sink = await self._sink(plural)
        items = [self._node()] if plural == "nodes" else [o.raw() for o in self.objects.values()]
        await sink.begin_list()
        await sink.list_page(page(items, next(_uids)))
        await sink.end_list(str(next(_uids)))

    def _deliver(self, plural: str) -> None:
        """A change of `plural`: seen now, or when its relist ends."""
        self.owed = True
        if plural not in self.relisting:
            self.loop.run(lambda: self._list(plural))
            if self.relisting:
                # Seen while the other query relists (not known): the component cannot select
                # and keeps what runs (NoUniqueTarget, "not readable"), a deferred trial dropped
                # (tried again from the selection once the relist ends).
                self.model.kept, self.model.deferred = "NoUniqueTarget", None
        self._settle_and_select()

    def _settle(self) -> None:
        async def settle() -> None:
            for _ in range(4):
                await trio.testing.wait_all_tasks_blocked()
                self.loop.clock.jump(0.6)  # coalescing (0.05 s) and the owed recheck (1 s)
            await trio.testing.wait_all_tasks_blocked()

        self.loop.run(settle)

    def _settle_and_select(self) -> None:
        self._settle()
        if self.owed and not self.relisting:
            self.owed = False
            self._select()

    # -- the reference model ---------------------------------------------------------------

    def _target(self) -> tuple[str, Obj | None]:
        m = self.model
        readable = [o for o in self.objects.values() if not o.broken]
        if m.assigned is not None and any(
            o.broken and o.uid == m.assigned.uid for o in self.objects.values()
        ):
            return "unreadable", None
        for level in (
            [o for o in readable if o.shape == "named"],
            [o for o in readable if o.shape == f"pool-{self.labels['pool']}"],
            [o for o in readable if o.shape == "global"],
        ):
            if len(level) == 1:
                return "target", level[0]
            if level:
                return "tie", None
        return "none", None

    def _select(self) -> None:
        m = self.model
        m.deferred = None
        outcome, obj = self._target()
        if outcome == "tie":
            m.kept = m.condition = "NoUniqueTarget"
            return
        if outcome == "unreadable":
            m.kept = m.condition = "TargetUnreadable"
            return
        m.kept = None
        m.gated = True
        m.expired = False  # the apiserver confirmed (or replaced) the assignment
        if obj is None:
            m.assigned, m.active, m.lkg, m.trial = None, LOCAL_HASH, None, None
            m.passed = None
            m.condition = "Local"
            return
        m.assigned = Obj(**{**obj.__dict__, "config": dict(obj.config)})
        m.configs[obj.hash] = dict(obj.config)
        if obj.hash == m.active:
            lkg = m.lkg if m.lkg is not None else LOCAL_HASH
            if obj.rollout and obj.said("abort") and lkg != obj.hash:
                # Aborted: back to last-known-good, not marked bad.
                m.active, m.trial, m.passed = lkg, None, None
                m.condition = "RolloutAborted"
                return
            if m.passed == m.active and not self._held(m.passed, True):
                m.lkg, m.passed = m.passed, None
            m.condition = "OnTrial" if m.trial is not None else "Active"
            return
        if m.bad.get(obj.hash) == obj.key:
            m.condition = m.bad_reason[obj.hash]
            return
        if m.lkg == obj.hash:
            # Back to last-known-good at once, whatever its rollout says (no wave, no trial).
            m.active, m.trial, m.condition = obj.hash, None, "Active"
            m.passed = None
            return
        if not obj.admitted:
            m.condition = obj.waiting  # what runs keeps running
            return
        if "bogus" in obj.config:
            self._mark_bad(obj.hash, obj.key, "ConfigInvalid")
            m.condition = "ConfigInvalid"
            return
        if m.read_only:
            # Its trial marker cannot be written: not applied (a crash on it would not be
            # blamed at the next start), tried again once the checkpoint can be written.
            m.deferred, m.condition = obj, "TrialDeferred"
            return
        self._start_trial(obj)

    def _start_trial(self, obj: Obj) -> None:
        m = self.model
        if m.lkg is None:
            m.lkg = m.active
        m.active, m.trial, m.trial_restarts = obj.hash, obj.hash, 0
        m.trial_rollout, m.passed = obj.rollout, None
        m.condition = "OnTrial"

    def _held(self, hash_: str, rollout: bool) -> bool:
        """A config through its trial stays short of last-known-good: the assigned object's
        rollout is not Complete (as the object was when last assigned; before any assignment
        since the start, or about another config: as recorded with its trial)."""
        a = self.model.assigned
        if self.model.gated and a is not None and a.hash == hash_:
            return a.rollout and not a.said("complete")
        return rollout

    def _end_trial(self) -> None:
        m = self.model
        assert m.trial is not None
        m.promoted.add(m.active)  # it ran to the end of a trial
        if self._held(m.trial, m.trial_rollout):
            m.passed = m.active
        else:
            m.lkg = m.active
        m.trial = None

    def _resting(self) -> str:
        """The condition once nothing is being decided: what the watch could not choose, the
        assigned config's error (it stays while it is assigned, the kubelet's rule), the
        trial, or what runs."""
        m = self.model
        if m.kept is not None:
            return m.kept
        if m.deferred is not None:
            return "TrialDeferred"
        a = m.assigned
        if a is not None and a.hash != m.active and m.bad.get(a.hash) == a.key:
            return m.bad_reason[a.hash]
        if a is not None and a.hash != m.active and not a.admitted:
            return a.waiting
        if m.trial is not None:
            return "OnTrial"
        return "Active" if a is not None else "Local"

    def _mark_bad(self, hash_: str, key: str, reason: str) -> None:
        self.model.bad[hash_] = key
        self.model.bad_reason[hash_] = reason

    def _boot(self, *, crashed: bool) -> None:
        m = self.model
        if m.trial is not None and not crashed:
            m.trial_restarts += 1
            if m.trial_restarts < CRASHLOOP and not m.expired:
                return  # resumed: the same config, on trial for what was left
            crashed = m.trial_restarts >= CRASHLOOP
            if not crashed:
                m.trial = None  # past the grace: dropped, not blamed
        if m.trial is not None and crashed:
            assert m.assigned is not None
            self._mark_bad(m.trial, m.assigned.key, "RolledBack")
            m.trial = None
            m.condition = "RolledBack"
        m.gated = False
        if m.expired:
            m.passed = None
        if m.passed is not None:
            m.active = m.passed  # what ran, through its trial: not on trial again
        elif m.lkg is not None and m.lkg != LOCAL_HASH:
            if m.expired:
                m.lkg, m.active = None, LOCAL_HASH
            else:
                m.active = m.lkg
        else:
            m.active = LOCAL_HASH

    # -- rules: the cluster ------------------------------------------------------------------

    @rule(pool=st.sampled_from(("x", "y")))
    def relabel_node(self, pool: str) -> None:
        if self.labels["pool"] != pool:
            self.labels = {"pool": pool}
            self.node_rv = next(_uids)
            self._deliver("nodes")

    @rule(
        name=st.sampled_from(NAMES),
        shape=st.sampled_from(SHAPES),
        config=st.sampled_from(CONFIGS),
        rollout=st.booleans(),
    )
    def create(self, name: str, shape: str, config: dict[str, Any], rollout: bool) -> None:
        if name not in self.objects:
            # A new object has a resourceVersion of its own: the apiserver never gives a
            # re-created object (same name, new UID) the version of the one it replaces.
            uid = f"uid-{name}-{next(_uids)}"
            obj = Obj(name, uid, shape, dict(config), rv=next(_uids), rollout=rollout)
            self.objects[name] = obj
            self._deliver(NAC.plural)

    @rule(name=st.sampled_from(NAMES), state=st.sampled_from(ROLLOUT_STATES))
    def rollout_status(self, name: str, state: str) -> None:
        """The rollout controller writes status.rollout for the object's config (a status-only
        change: the generation stays): this node's wave not yet, admitted, Complete, Aborted."""
        obj = self.objects.get(name)
        if obj is not None and obj.rollout and not obj.said(state):
            obj.status = (obj.hash, state)
            obj.rv = next(_uids)
            self._deliver(NAC.plural)

    @rule(name=st.sampled_from(NAMES), config=st.sampled_from(CONFIGS))
    def edit(self, name: str, config: dict[str, Any]) -> None:
        obj = self.objects.get(name)
        if obj is not None and (obj.config != config or obj.broken):
            obj.config, obj.broken = dict(config), False
            obj.generation += 1
            obj.rv = next(_uids)
            self._deliver(NAC.plural)

    @rule(name=st.sampled_from(NAMES))
    def revert(self, name: str) -> None:
        """The operator's fast undo: the object's config set back to the one the node has as
        last-known-good (kubectl apply of the previous config) under a rollout (spec.rollout,
        its status about the config it replaces until the controller writes again)."""
        lkg = self.model.lkg
        config = None if lkg is None else self.model.configs.get(lkg)
        obj = self.objects.get(name)
        if config is not None and obj is not None and obj.hash != lkg:
            obj.rollout = True
            self.edit(name, config)

    @rule(name=st.sampled_from(NAMES))
    def break_object(self, name: str) -> None:
        obj = self.objects.get(name)
        if obj is not None and not obj.broken:
            obj.broken = True
            obj.generation += 1
            obj.rv = next(_uids)
            self._deliver(NAC.plural)

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        if self.objects.pop(name, None) is not None:
            self._deliver(NAC.plural)

    @rule(plural=st.sampled_from(("nodes", NAC.plural)))
    def relist_starts(self, plural: str) -> None:
        if plural not in self.relisting:
            self.relisting.add(plural)
            self.loop.run(lambda: self._begin(plural))
            self._settle()

    async def _begin(self, plural: str) -> None:
        await (await self._sink(plural)).begin_list()

    @rule(plural=st.sampled_from(("nodes", NAC.plural)))
    def relist_ends(self, plural: str) -> None:
        if plural in self.relisting:
            self.relisting.discard(plural)

            async def end() -> None:
                sink = await self._sink(plural)
                items = (
                    [self._node()]
                    if plural == "nodes"
                    else [o.raw() for o in self.objects.values()]
                )
                await sink.list_page(page(items, next(_uids)))
                await sink.end_list(str(next(_uids)))

            self.loop.run(end)
            if plural == NAC.plural:
                # A completed list of the objects is selected, also one that changed nothing:
                # it confirms the assignment (the grace counts from it again).
                self.owed = True
            self._settle_and_select()

    # -- rules: the trial --------------------------------------------------------------------

    @rule()
    def unhealthy(self) -> None:
        """A component not ready for longer than the bound: a trial under way rolls back."""
        self.ready[0] = False
        for _ in range(14):  # every health check sees it: 77 s > unready_bound
            self.loop.clock.jump(SETTINGS.health_interval + 0.5)
            self._settle()
        self.ready[0] = True
        m = self.model
        if m.trial is not None:
            assert m.assigned is not None
            self._mark_bad(m.trial, m.assigned.key, "RolledBack")
            m.active = m.lkg if m.lkg is not None and m.lkg != m.trial else LOCAL_HASH
            m.trial = None
            m.condition = self._resting()

    @rule()
    def trial_ends(self) -> None:
        """The trial's time passes with the apiserver answering: the live assignment is
        confirmed on the way (unless the watch cannot select: a tie, a relist, unreadable)."""
        self.answering[0] = True
        self.loop.clock.jump(TRIAL + 1)
        self._settle()
        self.answering[0] = False
        m = self.model
        if not self.relisting and m.kept is None:
            m.expired = False
        if m.trial is not None:
            self._end_trial()
            m.condition = self._resting()

    # -- rules: the process ------------------------------------------------------------------

    @rule(long=st.booleans())
    def clean_restart(self, long: bool) -> None:
        async def stop_clean() -> None:
            await self.agent.stop()
            self.agent.controller.stop_clean()  # as the agent does once its tasks ended

        self.loop.run(stop_clean)
        self._down(long)
        self._boot(crashed=False)
        self._start()

    @rule(long=st.booleans())
    def crash_restart(self, long: bool) -> None:
        self.loop.run(self.agent.stop)  # nothing recorded: as kill -9
        self._down(long)
        self._boot(crashed=True)
        self._start()

    def _down(self, long: bool) -> None:
        """The agent is down; `long`: longer than the checkpoint grace (the start sees it). Only
        while it is down: a running agent's wall clock jumping forward by the grace is not
        "confirmed" by the next selection (it confirms at most every quarter grace of the
        monotonic clock), which this model does not follow."""
        if long:
            self.wall.now += GRACE + 1
            self.model.expired = True

    @precondition(lambda self: not self.model.read_only)
    @rule(full=st.booleans())
    def state_read_only(self, full: bool) -> None:
        """The checkpoint directory turns read-only (EROFS) or full (ENOSPC)."""
        self.disk.broken[self.directory] = errno.ENOSPC if full else errno.EROFS
        self.model.read_only = True

    @precondition(lambda self: self.model.read_only)
    @rule()
    def state_writable(self) -> None:
        """Writable again: within the longest retry, the state is written to the checkpoint
        (the runtime copy removed, the store's problem gone) and a deferred trial starts."""
        self.disk.broken.clear()
        self.model.read_only = False
        self.loop.clock.jump(RETRY_MAX + 1)
        self._settle()
        m = self.model
        if m.deferred is not None:
            self._start_trial(m.deferred)
            m.deferred = None
        assert not self.agent.runtime.path("dynconfig_state").exists()
        assert self.agent.store.problem is None

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def running_config_is_the_models(self) -> None:
        c, m = self.agent.controller, self.model
        assert c.active.hash == m.active, (c.active, m)
        expected = dict(build(None)) if m.active == LOCAL_HASH else build(m.configs[m.active])
        assert self.agent.hub.current == expected

    @invariant()
    def last_known_good_ran_to_the_end_of_a_trial(self) -> None:
        c, m = self.agent.controller, self.model
        lkg = None if c.state.lkg is None else c.state.lkg.hash
        assert lkg == m.lkg, (c.state.lkg, m)
        assert lkg is None or lkg == LOCAL_HASH or lkg in m.promoted

    @invariant()
    def the_trial_is_the_models_and_never_its_own_rollback_target(self) -> None:
        c, m = self.agent.controller, self.model
        trial = None if c.state.trial is None else c.state.trial.hash
        assert trial == m.trial, (c.state.trial, m)
        if trial is not None:
            assert c.state.lkg is not None and c.state.lkg.hash != trial

    @invariant()
    def never_an_unadmitted_config_of_a_rollout_nor_an_incomplete_last_known_good(self) -> None:
        """Checked on the real controller against the object as it was assigned: a switch to
        the assigned config of a rollout object only when its status admits the node or it is
        the node's last-known-good (a return, taken at once), and a new last-known-good of a
        rollout object only once its status says Complete."""
        c, a = self.agent.controller, self.model.assigned
        active = c.active.hash
        lkg = None if c.state.lkg is None else c.state.lkg.hash
        if a is not None and a.rollout:
            if active != self.seen_active and active == a.hash:
                assert a.admitted or a.hash == self.seen_lkg, (a, c.condition())
            if lkg != self.seen_lkg and lkg == a.hash:
                assert a.said("complete"), (a, c.state)
        self.seen_active, self.seen_lkg = active, lkg

    @invariant()
    def bad_configs_are_the_models(self) -> None:
        c, m = self.agent.controller, self.model
        assert {b.hash: b.object_key for b in c.state.bad} == m.bad

    @invariant()
    def a_restart_would_read_the_controllers_state(self) -> None:
        """What the next start reads (the runtime copy while the checkpoint is behind, else the
        checkpoint) is the state the controller runs on: a clean stop, a promotion, a
        rollback while the directory is read-only are not lost."""
        kept = load_runtime(self.agent.runtime)
        stored = kept if kept is not None else load(self.agent.store)
        if isinstance(stored, str):
            assert stored == "no checkpoint" and self.agent.controller.state == State()
            return
        assert stored == self.agent.controller.state, (stored, self.agent.controller.state)

    @precondition(lambda self: not self.relisting)
    @invariant()
    def the_condition_is_the_models_and_written(self) -> None:
        c, m = self.agent.controller, self.model
        assert c.condition().reason == m.condition, (c.condition(), m)
        assert self.agent.component.condition.written == c.condition()


DynconfigModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("DYNCONFIG_MODEL_EXAMPLES", "60")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_dynconfig_model = DynconfigModel.TestCase


def test_a_revert_to_last_known_good_under_a_rollout_is_taken_at_once() -> None:
    """The model's path to the operator's fast undo, spelled out (Hypothesis reaches it
    rarely): a config through its trial, another on trial, the first applied again under a
    rollout no controller has planned yet: taken at once (issue 31), checked by the invariants."""
    machine = DynconfigModel()

    def check() -> None:
        machine.running_config_is_the_models()
        machine.never_an_unadmitted_config_of_a_rollout_nor_an_incomplete_last_known_good()
        machine.the_condition_is_the_models_and_written()

    try:
        machine.create("a", "named", {"interval": 6}, rollout=False)
        machine.trial_ends()
        check()
        machine.edit("a", {"interval": 7})
        check()
        machine.revert("a")
        check()
        assert machine.agent.controller.active.hash == hasher({"interval": 6})
    finally:
        machine.teardown()
