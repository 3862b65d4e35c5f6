"""The driver's store of every client's persistent state: in memory between checkpoints, on
disk at each checkpoint, one file per client.

A method's client state (FedCon's projector, FedSEAL's self-ensemble) is whatever its clients
keep between rounds; a federation may have thousands of clients. The store keeps the states
it was given or read in memory, up to ``memory_bytes`` (the least recently used beyond it are
dropped, written first where they are not on disk yet), and writes a changed state to a file of
its own, named by client and round (``<cid>.r<round>.pt``), when a checkpoint is made
(:meth:`ClientStateStore.state_dict`): a round reads and writes no file between checkpoints,
and the checkpoint records only the manifest, which round's file holds each client's state. A
checkpoint therefore writes what changed and nothing else, and the driver's memory is bounded
whatever the number of clients.

Consistency after a kill at any moment: a file is written to a temporary name and renamed (a
failed write, a full disk, removes the temporary file and raises
:class:`~fedlit.federation.checkpoint.WriteFailed` naming the file and the free space); a
round's files are new names, never overwriting the files the last checkpoint's manifest names;
older files are removed only after a checkpoint naming the newer ones is written
(:meth:`prune`). Files no manifest names (a round killed before its checkpoint) are removed
when the store is opened on the checkpoint's manifest.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from fedlit.aggregation.rules import state_bytes
from fedlit.federation.checkpoint import write_atomically

#: The folder, beside the checkpoint file, that holds the client states.
CLIENT_DIR = "clients"


def _name(client_id: int, round_idx: int) -> str:
    return f"{client_id}.r{round_idx}.pt"


def _save(path: Path, state: Any) -> None:
    write_atomically(path, lambda tmp: torch.save(state, tmp))


def _copied(state: Any) -> Any:
    """A copy of ``state`` whose tensors are new (what a file read would give): a client that
    changes its state in place and then fails leaves the kept one as it was."""
    return tree_map(lambda x: x.clone() if torch.is_tensor(x) else x, state)


#: The client states a store keeps in memory at most, by default (bytes of their tensors).
MEMORY_BYTES = 1 << 30


class ClientStateStore:
    """Client id -> persistent state (whatever the method keeps; never uploaded), in
    ``directory``. Stateless methods write nothing.

    Args:
        directory: where the state files go (``<run>/checkpoints/clients``).
        memory_bytes: the states kept in memory at most (bytes of their tensors).
    """

    def __init__(self, directory: Path, memory_bytes: int = MEMORY_BYTES) -> None:
        self.directory = Path(directory)
        self.manifest: dict[int, int] = {}  # client -> round of its state's file (checkpointed)
        self.pending: dict[int, int | None] = {}  # put since the last checkpoint (None: gone)
        self.source = self.directory  # where the manifest's files are (see load_state_dict)
        self.round_idx = 0
        self.bytes_written = 0  # of the states put since the last checkpoint
        self.memory_bytes = memory_bytes
        self._kept: dict[int, tuple[Any, int]] = {}  # client -> (state, its bytes), LRU order
        self._unwritten: set[int] = set()  # kept states whose pending file is not written yet

    def begin_round(self, round_idx: int) -> None:
        """States put from now on belong to round ``round_idx``."""
        self.round_idx = round_idx

    def _file(self, client_id: int) -> Path | None:
        if client_id in self.pending:
            version = self.pending[client_id]
            return None if version is None else self.directory / _name(client_id, version)
        version = self.manifest.get(client_id)
        return None if version is None else self.source / _name(client_id, version)

    def get(self, client_id: int) -> Any:
        """The client's state (a copy), or None if it has none."""
        if client_id in self._kept:
            state, size = self._kept.pop(client_id)
            self._kept[client_id] = (state, size)  # the most recently used now
            return _copied(state)
        path = self._file(client_id)
        if path is None:
            return None
        state = torch.load(path, weights_only=True)
        self._keep(client_id, _copied(state))
        return state

    def put(self, client_id: int, state: Any) -> None:
        """The client's new state (None: it keeps none), kept in memory and written with the
        next checkpoint."""
        self._kept.pop(client_id, None)
        self._unwritten.discard(client_id)
        if state is None:
            if client_id in self.manifest or self.pending.get(client_id) is not None:
                self.pending[client_id] = None
            return
        self.pending[client_id] = self.round_idx
        self._unwritten.add(client_id)
        self.bytes_written += self._keep(client_id, state)

    def _keep(self, client_id: int, state: Any) -> int:
        """Keep ``state`` in memory, dropping the least recently used beyond the budget
        (written first where they are not on disk yet); its bytes."""
        size = state_bytes(state)
        self._kept[client_id] = (state, size)
        total = sum(b for _, b in self._kept.values())
        for old in list(self._kept):
            if total <= self.memory_bytes or old == client_id:
                break
            self._write(old)
            total -= self._kept.pop(old)[1]
        return size

    def _write(self, client_id: int) -> None:
        """Write a kept state whose file is pending and not written yet."""
        if client_id not in self._unwritten:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        _save(
            self.directory / _name(client_id, self.round_idx_of(client_id)),
            self._kept[client_id][0],
        )
        self._unwritten.discard(client_id)

    def round_idx_of(self, client_id: int) -> int:
        """The round whose file holds the client's pending state."""
        version = self.pending[client_id]
        assert version is not None
        return version

    def client_ids(self) -> list[int]:
        """The clients that hold a state, in order."""
        return sorted(c for c in {*self.manifest, *self.pending} if self._file(c) is not None)

    def state_dict(self) -> dict[int, int]:
        """The manifest a checkpoint records: client -> round of its state's file, the states
        put since the last checkpoint included (their files written now, so that every file
        the manifest names is on disk)."""
        for client_id in sorted(self._unwritten):
            self._write(client_id)
        merged = {**self.manifest, **self.pending}
        return {c: r for c, r in sorted(merged.items()) if r is not None}

    def checkpointed(self) -> None:
        """A checkpoint holding :meth:`state_dict` has been written: it is the manifest now,
        and the files it no longer names are removed."""
        self.manifest = self.state_dict()
        self.pending = {}
        self.bytes_written = 0
        self.prune()

    def prune(self) -> None:
        """Remove every state file the manifest does not name (older versions, and the files
        of a round killed before its checkpoint)."""
        if not self.directory.is_dir():
            return
        keep = {_name(c, r) for c, r in self.manifest.items()}
        for path in self.directory.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def load_state_dict(self, manifest: dict[int, int], source: Path | None = None) -> None:
        """Continue from a checkpoint's ``manifest``, whose files are in ``source`` (default:
        :attr:`directory`; another folder for a resume into a new run directory). Writes
        nothing: :meth:`open` does, once the run directory may be written."""
        self.manifest, self.pending = {int(c): int(r) for c, r in manifest.items()}, {}
        self._kept, self._unwritten = {}, set()
        self.source = Path(source) if source is not None else self.directory
        missing = [c for c, r in self.manifest.items() if not (self.source / _name(c, r)).is_file()]
        if missing:
            raise ValueError(
                f"federation.resume: the state file of client {missing[0]} is missing from "
                f"{self.source} ({len(missing)} of {len(self.manifest)} missing)"
            )

    def open(self) -> None:
        """Make :attr:`directory` hold the manifest's files and nothing else: copy them from a
        resumed run's folder, remove the files of a round killed before its checkpoint."""
        if self.source.resolve() != self.directory.resolve():
            self.directory.mkdir(parents=True, exist_ok=True)
            for c, r in self.manifest.items():
                shutil.copyfile(self.source / _name(c, r), self.directory / _name(c, r))
            self.source = self.directory
        self.prune()


def load_client_states(checkpoint: Path) -> dict[int, Any]:
    """Every client's state as a federation checkpoint (``<run>/checkpoints/last.ckpt``)
    left it: client id -> state."""
    from fedlit.federation.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    folder = Path(checkpoint).parent / CLIENT_DIR
    return {
        int(c): torch.load(folder / _name(int(c), int(r)), weights_only=True)
        for c, r in ckpt["client_states"].items()
    }
