"""Client states in memory between checkpoints and on disk at each: a checkpoint writes what
changed, a kill at any moment leaves the last checkpoint's states readable, a resume into a new
directory takes its files along."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedlit.federation import ClientStateStore


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), value)}


def _files(store: ClientStateStore) -> list[str]:
    return sorted(p.name for p in store.directory.iterdir())


def test_a_round_writes_only_the_clients_it_changed(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path / "clients")
    store.begin_round(1)
    for cid in range(5):
        store.put(cid, _state(cid))
    store.checkpointed()
    store.begin_round(2)
    store.put(3, _state(30.0))
    assert store.bytes_written == 16 * 4  # one client's state (16 floats), not five
    assert store.get(3)["w"][0, 0] == 30.0 and store.get(1)["w"][0, 0] == 1.0
    assert "3.r2.pt" not in _files(store)  # written with the next checkpoint, not before
    assert store.state_dict() == {0: 1, 1: 1, 2: 1, 3: 2, 4: 1}
    assert "3.r2.pt" in _files(store)
    store.checkpointed()
    assert "3.r1.pt" not in _files(store) and "3.r2.pt" in _files(store)  # the old version went
    store.put(4, None)  # a client that keeps no state any more
    assert store.get(4) is None and store.client_ids() == [0, 1, 2, 3]


def test_a_round_killed_before_its_checkpoint_leaves_the_last_one_readable(
    tmp_path: Path,
) -> None:
    store = ClientStateStore(tmp_path / "clients")
    store.begin_round(1)
    store.put(0, _state(1.0))
    store.put(1, _state(1.0))
    manifest = store.state_dict()
    store.checkpointed()
    store.begin_round(2)  # killed after writing round 2's state of client 0
    store.put(0, _state(2.0))
    store.memory_bytes = 0  # (written at once when kept beyond the memory's budget)
    store.put(1, _state(2.0))
    assert "0.r2.pt" in _files(store)
    assert "0.r1.pt" in _files(store)  # never overwritten before a checkpoint names 0.r2
    resumed = ClientStateStore(tmp_path / "clients")
    resumed.load_state_dict(manifest)
    assert resumed.get(0)["w"][0, 0] == 1.0  # the checkpoint's state, not the killed round's
    resumed.open()
    assert _files(resumed) == ["0.r1.pt", "1.r1.pt"]  # the killed round's file is removed


def test_resume_into_a_new_directory_copies_the_states(tmp_path: Path) -> None:
    old = ClientStateStore(tmp_path / "old")
    old.begin_round(1)
    old.put(7, _state(7.0))
    old.checkpointed()
    new = ClientStateStore(tmp_path / "new")
    new.load_state_dict(old.state_dict(), source=old.directory)
    assert not new.directory.exists()  # loading writes nothing
    new.open()
    assert _files(new) == ["7.r1.pt"] and _files(old) == ["7.r1.pt"]  # the old run is kept
    assert new.get(7)["w"][0, 0] == 7.0


def test_a_missing_state_file_is_named(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path / "clients")
    with pytest.raises(ValueError, match="state file of client 3 is missing"):
        store.load_state_dict({3: 2})


def test_no_file_is_read_or_written_between_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ClientStateStore(tmp_path / "clients")
    store.begin_round(1)
    for cid in range(3):
        store.put(cid, _state(float(cid)))
    store.checkpointed()
    calls: list[str] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append("load"))
    monkeypatch.setattr(torch, "save", lambda *a, **k: calls.append("save"))
    for round_idx in (2, 3):
        store.begin_round(round_idx)
        for cid in range(3):
            state = store.get(cid)
            state["w"] += 1.0  # a client that changes its state in place
            store.put(cid, {"w": state["w"].clone()})
    assert calls == []
    assert store.get(2)["w"][0, 0] == 4.0


def test_states_beyond_the_memory_budget_are_written_and_read_back(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path / "clients", memory_bytes=2 * 16 * 4)  # two states
    store.begin_round(1)
    for cid in range(4):
        store.put(cid, _state(float(cid)))
    assert _files(store) == ["0.r1.pt", "1.r1.pt"]  # the least recently used, spilled
    assert [store.get(cid)["w"][0, 0].item() for cid in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert store.state_dict() == {0: 1, 1: 1, 2: 1, 3: 1}
    assert _files(store) == ["0.r1.pt", "1.r1.pt", "2.r1.pt", "3.r1.pt"]


def test_a_kept_state_is_not_changed_by_its_client(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path / "clients")
    store.put(0, _state(1.0))
    store.get(0)["w"].fill_(9.0)  # a client that fails after changing its state in place
    assert store.get(0)["w"][0, 0] == 1.0
