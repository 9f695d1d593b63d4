"""The reconciler's desired-state / actual-state plan, including a convergence property."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.plugins.state import (
    ActualPlugin,
    ActualState,
    Caches,
    DesiredState,
    PluginRecord,
    PluginState,
    SocketIdentity,
    plan,
)


def _identity(n: int) -> SocketIdentity:
    return SocketIdentity(device=1, inode=n, ctime_ns=n * 1000)


def _register(actual: ActualState, socket: str, generation: int) -> None:
    actual.add(ActualPlugin(socket, generation, "ReporterPlugin", socket, socket, ("v1alpha1",)))


def test_new_socket_is_registered() -> None:
    desired, actual = DesiredState(), ActualState()
    entry = desired.add_or_update("/r/a.sock", _identity(1))
    work = plan(desired, actual)
    assert work.register == [entry]
    assert work.unregister == []


def test_registered_and_unchanged_socket_needs_nothing() -> None:
    desired, actual = DesiredState(), ActualState()
    entry = desired.add_or_update("/r/a.sock", _identity(1))
    _register(actual, entry.socket, entry.generation)
    # Seeing the same socket again keeps its generation.
    assert desired.add_or_update("/r/a.sock", _identity(1)) == entry
    work = plan(desired, actual)
    assert work.register == [] and work.unregister == []


def test_removed_socket_is_unregistered() -> None:
    desired, actual = DesiredState(), ActualState()
    entry = desired.add_or_update("/r/a.sock", _identity(1))
    _register(actual, entry.socket, entry.generation)
    desired.remove("/r/a.sock")
    work = plan(desired, actual)
    assert [p.socket for p in work.unregister] == ["/r/a.sock"]
    assert work.register == []


def test_recreated_socket_is_unregistered_and_registered_again() -> None:
    desired, actual = DesiredState(), ActualState()
    old = desired.add_or_update("/r/a.sock", _identity(1))
    _register(actual, old.socket, old.generation)
    new = desired.add_or_update("/r/a.sock", _identity(2))
    assert new.generation != old.generation
    work = plan(desired, actual)
    assert [p.generation for p in work.unregister] == [old.generation]
    assert work.register == [new]


def test_forced_new_generation_re_registers_an_unchanged_socket() -> None:
    desired, actual = DesiredState(), ActualState()
    old = desired.add_or_update("/r/a.sock", _identity(1))
    _register(actual, old.socket, old.generation)
    desired.remove("/r/a.sock")
    new = desired.force_new_generation("/r/a.sock", _identity(1))
    work = plan(desired, actual)
    assert [p.generation for p in work.unregister] == [old.generation]
    assert work.register == [new]


sockets = st.sampled_from(["/r/a.sock", "/r/b.sock", "/r/sub/c.sock"])
events = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "reconcile"]), sockets, st.integers(1, 3)),
    max_size=40,
)


@given(events)
def test_reconciling_converges_actual_state_to_desired_state(
    history: list[tuple[str, str, int]],
) -> None:
    desired, actual = DesiredState(), ActualState()

    def reconcile() -> None:
        work = plan(desired, actual)
        for registered in work.unregister:
            actual.remove(registered.socket)
        # Like the reconciler: a socket whose unregister ran registers on a later pass.
        unregistered = {p.socket for p in work.unregister}
        for wanted in work.register:
            if wanted.socket not in unregistered:
                _register(actual, wanted.socket, wanted.generation)

    for action, socket, n in history:
        if action == "add":
            desired.add_or_update(socket, _identity(n))
        elif action == "remove":
            desired.remove(socket)
        else:
            reconcile()
    reconcile()
    reconcile()
    assert {(p.socket, p.generation) for p in actual.plugins()} == {
        (p.socket, p.generation) for p in desired.plugins()
    }
    final = plan(desired, actual)
    assert final.register == [] and final.unregister == []


def test_plugin_states_show_as_their_plain_names() -> None:
    assert [s.value for s in PluginState] == [
        "registering",
        "registered",
        "failed",
        "rejected",
        "stale",
        "deregistered",
    ]
    assert PluginState("registered") is PluginState.REGISTERED
    assert json.dumps(PluginState.FAILED) == '"failed"'


def test_caches_clear_empties_all_three() -> None:
    caches = Caches()
    wanted = caches.desired.add_or_update("/r/a.sock", _identity(1))
    _register(caches.actual, "/r/a.sock", wanted.generation)
    caches.records["/r/a.sock"] = PluginRecord("/r/a.sock", wanted.generation)
    caches.clear()
    assert caches.desired.plugins() == [] and caches.actual.plugins() == []
    assert caches.records == {}
    assert caches.desired.add_or_update("/r/a.sock", _identity(1)).generation > wanted.generation
