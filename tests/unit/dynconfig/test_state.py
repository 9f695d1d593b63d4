"""The checkpointed dynamic-config state: a bad config's kind is an enum in the code and the same
string in the checkpoint (format 1 unchanged), and an unknown kind is an unreadable checkpoint,
not a crash."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig.state import CHECKPOINT_NAME, Bad, BadKind, State, load, save

CHECKPOINT = (
    b'{"version":1,"assigned":null,"assigned_at":null,"lkg":null,"lkg_at":null,'
    b'"bad":[{"hash":"abc","object_key":"u/1","name":"fleet","kind":"veto",'
    b'"reason":"publisher: no","at":5.0}],"trial":null,"confirmed_at":null,"bad_file":null}'
)


def test_a_checkpoint_written_before_the_enum_reads_the_same(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write(CHECKPOINT_NAME, CHECKPOINT)
    state = load(store)
    assert isinstance(state, State)
    (bad,) = state.bad
    assert bad.kind is BadKind.VETO and str(bad.kind) == "veto"
    save(store, state)
    # The same, plus the fields added since with their defaults (issue 31: `passed`, the
    # config of a rollout held short of last-known-good; an older agent ignores them).
    saved = store.read(CHECKPOINT_NAME).data
    assert saved is not None
    assert msgspec.json.decode(saved) == {**msgspec.json.decode(CHECKPOINT), "passed": None}


@pytest.mark.parametrize("kind", list(BadKind))
def test_every_kind_is_its_string_in_the_checkpoint(kind: BadKind) -> None:
    bad = Bad(hash="h", object_key="k", name="n", kind=kind, reason="r", at=1.0)
    assert msgspec.json.decode(msgspec.json.encode(bad))["kind"] == kind.value
    assert msgspec.json.decode(msgspec.json.encode(bad), type=Bad) == bad


def test_an_unknown_kind_is_an_unreadable_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write(CHECKPOINT_NAME, CHECKPOINT.replace(b'"veto"', b'"bogus"'))
    reason = load(store)
    assert isinstance(reason, str) and reason.startswith("checkpoint unreadable")


def test_the_bad_list_keeps_the_newest_32_and_one_entry_per_hash() -> None:
    state = State()
    for i in range(40):
        state.mark_bad(f"h{i}", "k", "n", BadKind.INVALID, "r", float(i))
    state.mark_bad("h39", "k2", "n", BadKind.VETO, "again", 41.0)
    assert len(state.bad) == 32
    assert [b.hash for b in state.bad][-2:] == ["h38", "h39"]
    assert state.bad[-1].kind is BadKind.VETO and state.bad[0].hash == "h8"


def test_a_checkpoint_that_cannot_be_read_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # boot() raises nothing: an I/O error is the local config's reason, as a corrupt file is.
    store = CheckpointStore(tmp_path)
    save(store, State())

    def fail(self: Path) -> bytes:
        raise OSError(5, "Input/output error", str(self))

    monkeypatch.setattr(Path, "read_bytes", fail)
    assert load(store) == "checkpoint unreadable: Input/output error"
