"""A model-based test of plugin registration: Hypothesis drives the synchronous core the manager's
async pieces call (`state.DesiredState.follow_scan` for the watcher, `state.operations` for the
reconciler, `Caches.registration_*` and `retry_at` for the executor, `Caches.probe_result` for
the monitor, `Caches.unreachable` and `stale_sockets` for readiness) through any interleaving of
socket files created, removed and recreated at the same path, plugins crashing (hung) or killed
(their socket left behind, refusing connections: issue 29 item 1's stale sockets) and coming
back on the same path, scans, reconciler passes, registrations and unregistrations ending, and
probes started and answered late, after the world they probed changed. After every step the
invariants below are checked.

The test owns what the async shell owns: which operations and probes are in flight, and the
clock. A probe's result is what the plugin it reached would answer: a plugin that is still the
one at the path and answers makes the probe succeed; for a crashed plugin it fails; a probe of a
socket recreated or removed meanwhile may have reached either process, so its result is free.
A killed plugin's socket refuses connections, so every probe and registration of it is refused;
the model expects such a socket `STALE` exactly when the last attempt on its generation was
refused (a registration, or the probe that made the monitor drop it), never counted against
readiness, and the plugin registered again once it binds the path anew. (That the agent never
deletes the file is outside this core, which touches no files: tests/plugins/test_stale_socket.py.)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nodeagent.core.backoff import Backoff
from nodeagent.plugins.state import (
    ActualPlugin,
    Caches,
    DesiredPlugin,
    PluginRecord,
    PluginState,
    ProbeVerdict,
    SocketIdentity,
    operations,
)

PATHS = ("/r/a.sock", "/r/b.sock")
BACKOFF = Backoff(0.5, 122.0)  # the kubelet's, as the executor uses it

_inodes = itertools.count(1)


@dataclass
class SocketFile:
    """A socket file in the registry and the plugin process behind it."""

    identity: SocketIdentity
    answers: bool = True  # False once the plugin crashed (its socket file stays)
    refuses: bool = False  # the plugin was killed: nobody listens, connections are refused


@dataclass(frozen=True)
class Registering:
    wanted: DesiredPlugin
    record: PluginRecord


@dataclass(frozen=True)
class Unregistering:
    registered: ActualPlugin


class RegistrationModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.caches = Caches()
        self.files: dict[str, SocketFile] = {}
        self.seen: dict[str, SocketIdentity] = {}  # what the last scan found
        self.busy: dict[str, Registering | Unregistering] = {}
        self.probes: list[ActualPlugin] = []  # in flight, each the registration it probes
        self.now = 0.0
        # Per generation: its failed registrations in a row and the retry time they imply.
        self.failures: dict[int, int] = {}
        self.expected_retry: dict[int, float] = {}
        self.identity_of: dict[int, SocketIdentity] = {}  # each generation's socket file
        self.probe_failures = 2
        # Per socket: the generation whose last attempt was refused (it must show STALE).
        self.refused: dict[str, int] = {}

    @initialize(paths=st.sets(st.sampled_from(PATHS)), probe_failures=st.sampled_from([1, 2, 3]))
    def start(self, paths: set[str], probe_failures: int) -> None:
        """Some plugins already registered (or not: the sockets appear later)."""
        self.probe_failures = probe_failures
        for path in sorted(paths):
            self.files[path] = SocketFile(_new_identity())
        self.scan()
        self.settle()

    # -- the registry ----------------------------------------------------------------------

    @rule(path=st.sampled_from(PATHS), scan=st.booleans())
    def create_socket(self, path: str, scan: bool) -> None:
        if path not in self.files:
            self.files[path] = SocketFile(_new_identity())
        if scan:  # at once, or at some later scan
            self.scan()

    @rule(path=st.sampled_from(PATHS), scan=st.booleans())
    def remove_socket(self, path: str, scan: bool) -> None:
        self.files.pop(path, None)
        if scan:
            self.scan()

    @rule(path=st.sampled_from(PATHS), scan=st.booleans())
    def recreate_socket(self, path: str, scan: bool) -> None:
        """A restarted container (or a fixed version): a new socket file, a new process."""
        if path in self.files:
            self.files[path] = SocketFile(_new_identity())
        if scan:
            self.scan()

    @rule(path=st.sampled_from(PATHS), probes=st.integers(0, 3))
    def crash_plugin(self, path: str, probes: int) -> None:
        """A hung plugin: its probes fail (time out) without being refused; then the monitor
        probes it `probes` times at once."""
        if path in self.files:
            self.files[path].answers = False
            self._monitor_probes(path, probes)

    @rule(path=st.sampled_from(PATHS), probes=st.integers(0, 3))
    def kill_plugin(self, path: str, probes: int) -> None:
        """SIGKILL or an OOM kill: the process is gone, its socket file stays, refusing. Then
        the monitor probes it `probes` times at once: after the probe failures in a row it is
        deregistered (the reconciler's next pass) and shown stale."""
        file = self.files.get(path)
        if file is None:
            return
        file.answers, file.refuses = False, True
        self._monitor_probes(path, probes)

    def _monitor_probes(self, path: str, probes: int) -> None:
        """The monitor probes the plugin registered at `path`, whose process (the file's) no
        longer answers, `probes` times in a row: deregistered at the probe failures, stale if
        its socket refuses."""
        file = self.files[path]
        for _ in range(probes):
            registered = self.caches.actual.get(path)
            if registered is None or path in self.busy:
                return
            record = self.caches.in_force(registered)
            if record is None or self.identity_of[registered.generation] != file.identity:
                return
            failed_before = record.probe_failures
            verdict = self._probe_ends(registered, False, file.refuses)
            if failed_before + 1 < self.probe_failures:
                assert verdict is ProbeVerdict.FAILED, verdict
                continue
            assert verdict is ProbeVerdict.DROPPED, verdict
            expected = PluginState.STALE if file.refuses else PluginState.FAILED
            assert record.state is expected, record
            assert self.caches.desired.get(path) is None
            return

    @rule(path=st.sampled_from(PATHS), scan=st.booleans())
    def plugin_returns(self, path: str, scan: bool) -> None:
        """A killed plugin restarted: it binds the same path again (unlink and bind: a new
        socket file, new inode and ctime). Once scanned, it registers again, stale no more."""
        file = self.files.get(path)
        if file is None or not file.refuses:
            return
        self.files[path] = SocketFile(_new_identity())
        if not scan:
            return
        self.scan()
        self.settle()
        registered = self.caches.actual.get(path)
        assert registered is not None, f"{path}: a plugin back on its path is not registered"
        assert self.identity_of[registered.generation] == self.files[path].identity
        record = self.caches.records[path]
        assert record.state is PluginState.REGISTERED, record
        assert path not in self.caches.stale_sockets()
        event("a killed plugin back on its path")

    @rule()
    def scan(self) -> None:
        found = {path: f.identity for path, f in self.files.items()}
        self.caches.desired.follow_scan(self.seen, found)
        self.seen = found

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 10.0, 60.0, 130.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    # -- the reconciler and the executor ---------------------------------------------------

    @rule()
    def reconcile(self) -> None:
        caches = self.caches
        work = operations(caches, self.busy.__contains__, self.now)
        sockets = [r.socket for r in work.unregister] + [w.socket for w in work.register]
        assert len(sockets) == len(set(sockets)), "two operations on one socket"
        next_due = math.inf
        for wanted in caches.desired.plugins():
            retry = caches.retry_at(wanted)
            waiting = retry is not None and retry > self.now and wanted.socket not in self.busy
            if waiting and caches.actual.get(wanted.socket) is None and not self._rejected(wanted):
                assert retry is not None
                next_due = min(next_due, retry)
        assert work.next_due == next_due
        for registered in work.unregister:
            assert registered.socket not in self.busy
            current = caches.desired.get(registered.socket)
            assert current is None or current.generation != registered.generation
            self.busy[registered.socket] = Unregistering(registered)
        for wanted in work.register:
            assert wanted.socket not in self.busy
            assert caches.actual.get(wanted.socket) is None
            assert not self._rejected(wanted), "a rejected generation registered again"
            retry = caches.retry_at(wanted)
            assert retry is None or retry <= self.now, "registered before its backoff expired"
            self.identity_of[wanted.generation] = wanted.identity
            self.busy[wanted.socket] = Registering(wanted, caches.registration_started(wanted))

    @rule()
    def settle(self) -> None:
        """A quiet while: passes run and every operation they start ends well, until there
        is nothing left to do but wait for backoffs (probes in flight stay in flight)."""
        for _ in range(10):
            self.reconcile()
            if not self.busy:
                self._converged()
                return
            for path in self._operations(Unregistering):
                self._unregistration_ends(path)
            for path in self._operations(Registering):
                self._registration_ends(path, "ok")
        raise AssertionError("the reconciler did not settle")

    @precondition(lambda self: self._operations(Registering))
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "fail", "reject"]))
    def registration_ends(self, data: st.DataObject, outcome: str) -> None:
        self._registration_ends(data.draw(st.sampled_from(self._operations(Registering))), outcome)

    def _registration_ends(self, path: str, outcome: str) -> None:
        op = self.busy.pop(path)
        assert isinstance(op, Registering)
        wanted, record = op.wanted, op.record
        generation = wanted.generation
        file = self.files.get(path)
        if file is not None and file.identity == wanted.identity and file.refuses:
            outcome = "refused"  # nobody listens: the connect is refused, whatever was drawn
        if outcome == "refused":
            self.caches.registration_failed(
                record, "cannot connect", self.now, BACKOFF, refused=True
            )
            failures = self.failures[generation] = self.failures.get(generation, 0) + 1
            self.expected_retry[generation] = self.now + BACKOFF.delay(failures)
            self.refused[path] = generation
            event("a killed plugin's registration refused")
            return
        self.refused.pop(path, None)
        if outcome == "ok":
            self.caches.actual.add(ActualPlugin(path, generation, "T", "p", path, ("v1",)))
            self.caches.registration_succeeded(record)
            self.failures.pop(generation, None)
            self.expected_retry.pop(generation, None)
        elif outcome == "fail":
            self.caches.registration_failed(record, "GetInfo failed", self.now, BACKOFF)
            failures = self.failures[generation] = self.failures.get(generation, 0) + 1
            self.expected_retry[generation] = self.now + BACKOFF.delay(failures)
        else:
            self.caches.registration_rejected(record, "not an allowed plugin UID")

    @precondition(lambda self: self._operations(Unregistering))
    @rule(data=st.data())
    def unregistration_ends(self, data: st.DataObject) -> None:
        self._unregistration_ends(data.draw(st.sampled_from(self._operations(Unregistering))))

    def _unregistration_ends(self, path: str) -> None:
        op = self.busy.pop(path)
        assert isinstance(op, Unregistering)
        self.caches.actual.remove(path)
        record = self.caches.records.get(path)
        if record is not None and record.state is PluginState.REGISTERED:
            record.state = PluginState.REGISTERING  # as the executor's unregister does

    # -- the monitor -----------------------------------------------------------------------

    @rule(path=st.sampled_from(PATHS))
    def probe_starts(self, path: str) -> None:
        registered = self.caches.actual.get(path)
        if registered is not None and path not in self.busy:
            self.probes.append(registered)

    @precondition(lambda self: self.probes)
    @rule(data=st.data())
    def probe_result_arrives(self, data: st.DataObject) -> None:
        """A probe ends, perhaps long after it started (up to the monitor's 30 s)."""
        probed = self.probes.pop(data.draw(st.integers(0, len(self.probes) - 1)))
        file = self.files.get(probed.socket)
        same_process = file is not None and file.identity == self.identity_of[probed.generation]
        # Recreated or removed meanwhile, it may have reached the old process or the new one.
        ok = file.answers if same_process and file is not None else data.draw(st.booleans())
        if same_process and file is not None:
            refused = file.refuses
        else:  # the old process (killed?), the new one (not listening yet?), or no file at all
            refused = not ok and data.draw(st.booleans())
        self._probe_ends(probed, ok, refused)

    def _probe_ends(self, probed: ActualPlugin, ok: bool, refused: bool) -> ProbeVerdict:
        file = self.files.get(probed.socket)
        same_process = file is not None and file.identity == self.identity_of[probed.generation]
        before = self.caches.desired.get(probed.socket)
        verdict = self.caches.probe_result(probed, ok, self.probe_failures, refused=refused)
        newer = self.caches.actual.get(probed.socket)
        if newer is not None and newer.generation != probed.generation:
            event(f"a probe result of an older generation, {'ok' if ok else 'failed'}")
        if verdict is ProbeVerdict.DROPPED:
            # Only for the registration it probed, while the agent knows no newer socket at the
            # path (one recreated but not scanned yet is registered at the next scan), and
            # never while the probed plugin itself answers.
            assert before is not None and before.generation == probed.generation
            assert self.seen.get(probed.socket) == self.identity_of[probed.generation]
            assert not (same_process and file is not None and file.answers)
        if verdict is not ProbeVerdict.STALE:
            assert self.caches.in_force(probed) is not None or verdict is ProbeVerdict.DROPPED
        if verdict is ProbeVerdict.DROPPED:
            # Deregistered after the probe failures: stale if the last one was refused.
            if refused:
                self.refused[probed.socket] = probed.generation
                event("a killed plugin deregistered as stale")
            else:
                self.refused.pop(probed.socket, None)
        return verdict

    @rule(path=st.sampled_from(PATHS))
    def dropped_socket_answers_again(self, path: str) -> None:
        """The monitor's probe of a socket the scan sees but the desired state lacks."""
        file = self.files.get(path)
        identity = self.seen.get(path)
        if file is None or identity is None or identity != file.identity or not file.answers:
            return
        if self.caches.desired.get(path) is None and path not in self.busy:
            self.caches.desired.force_new_generation(path, identity)

    @rule(path=st.sampled_from(PATHS))
    def dropped_socket_refuses(self, path: str) -> None:
        """The monitor's probe of a dropped socket refused (`ConnectionMonitor._refused`): a
        plugin hung until then was killed; its socket turns stale."""
        file = self.files.get(path)
        identity = self.seen.get(path)
        record = self.caches.records.get(path)
        if file is None or identity is None or identity != file.identity or not file.refuses:
            return
        if record is None or record.state is not PluginState.FAILED:
            return
        if self.caches.desired.get(path) is None and path not in self.busy:
            self.caches.socket_refused(record, record.last_error)
            self.refused[path] = record.generation
            event("a dropped socket refuses")

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def an_answering_newest_socket_stays_wanted(self) -> None:
        """A live plugin at the newest socket of its path, once scanned, is never out of the
        desired state (so never deregistered) whatever older generations' probes said."""
        for path, file in self.files.items():
            if file.answers and self.seen.get(path) == file.identity:
                wanted = self.caches.desired.get(path)
                assert wanted is not None, f"{path}: an answering plugin was dropped"
                assert wanted.identity == file.identity

    @invariant()
    def backoff_belongs_to_its_generation(self) -> None:
        """A generation's retry time is its own failures' (a new socket starts with none)."""
        for wanted in self.caches.desired.plugins():
            assert self.caches.retry_at(wanted) == self.expected_retry.get(wanted.generation)

    @invariant()
    def a_registration_in_force_shows_registered(self) -> None:
        """No `registering` without an error for a plugin that is registered and wanted."""
        for registered in self.caches.actual.plugins():
            if registered.socket in self.busy:
                continue
            wanted = self.caches.desired.get(registered.socket)
            if wanted is not None and wanted.generation == registered.generation:
                record = self.caches.records[registered.socket]
                assert record.generation == registered.generation
                assert record.state is PluginState.REGISTERED, record
                assert record.last_error == ""

    @invariant()
    def stale_exactly_when_refused(self) -> None:
        """A socket shows `STALE`, with its path and the fix, exactly when the last attempt on
        its generation was refused; a live plugin's socket never does."""
        for path, record in self.caches.records.items():
            expected = self.refused.get(path) == record.generation
            assert (record.state is PluginState.STALE) == expected, (record, self.refused)
            if expected:
                assert path in record.last_error and "remove it or restart" in record.last_error
                file = self.files.get(path)
                if file is not None and file.identity == self.identity_of.get(record.generation):
                    assert file.refuses, f"{path}: a socket that answers shown stale"

    @invariant()
    def stale_never_counts_against_readiness(self) -> None:
        """A stale socket is counted (the gauge) and never unreachable; any other failing
        registration is."""
        stale = sorted(p for p, r in self.caches.records.items() if r.state is PluginState.STALE)
        assert self.caches.stale_sockets() == stale
        unreachable = self.caches.unreachable()
        for path, record in self.caches.records.items():
            if record.state is PluginState.STALE:
                assert path not in unreachable, f"{path}: a stale socket counted unreachable"
            elif record.state is PluginState.FAILED:
                assert path in unreachable, f"{path}: a failing plugin not counted"

    @invariant()
    def records_follow_their_generation(self) -> None:
        for path, record in self.caches.records.items():
            assert record.socket == path
            op = self.busy.get(path)
            if isinstance(op, Registering):
                assert record is op.record and record.generation == op.wanted.generation

    # -- helpers ---------------------------------------------------------------------------

    def _converged(self) -> None:
        """Every wanted generation is registered but for those a rule rejected or whose own
        backoff has not expired (a new socket has none: it never waits for an older one's)."""
        for wanted in self.caches.desired.plugins():
            retry = self.caches.retry_at(wanted)
            if self._rejected(wanted) or (retry is not None and retry > self.now):
                continue
            registered = self.caches.actual.get(wanted.socket)
            assert registered is not None and registered.generation == wanted.generation

    def _operations(self, kind: type[Registering] | type[Unregistering]) -> list[str]:
        return sorted(path for path, op in self.busy.items() if isinstance(op, kind))

    def _rejected(self, wanted: DesiredPlugin) -> bool:
        record = self.caches.records.get(wanted.socket)
        return record is not None and record.rejected_generation == wanted.generation


def _new_identity() -> SocketIdentity:
    inode = next(_inodes)
    return SocketIdentity(device=1, inode=inode, ctime_ns=inode)


RegistrationModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_registration_model = RegistrationModel.TestCase
