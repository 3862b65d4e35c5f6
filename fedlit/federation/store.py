"""The driver's store of every client's persistent state, on disk, one file per client.

A method's client state (FedCon's projector, FedSEAL's self-ensemble) is whatever its clients
keep between rounds; a federation may have thousands of clients. So the store keeps no state
in memory: :meth:`ClientStateStore.put` writes the client's new state at once to a file of its
own, named by client and round (``<cid>.r<round>.pt``), and the checkpoint records only the
manifest, which round's file holds each client's state. A round therefore writes what changed
and nothing else, and the driver's memory does not grow with the clients that took part.

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

from fedlit.federation.checkpoint import write_atomically

#: The folder, beside the checkpoint file, that holds the client states.
CLIENT_DIR = "clients"


def _name(client_id: int, round_idx: int) -> str:
    return f"{client_id}.r{round_idx}.pt"


def _save(path: Path, state: Any) -> None:
    write_atomically(path, lambda tmp: torch.save(state, tmp))


class ClientStateStore:
    """Client id -> persistent state (whatever the method keeps; never uploaded), in
    ``directory``. Stateless methods write nothing.

    Args:
        directory: where the state files go (``<run>/checkpoints/clients``).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.manifest: dict[int, int] = {}  # client -> round of its state's file (checkpointed)
        self.pending: dict[int, int | None] = {}  # written since the last checkpoint (None: gone)
        self.source = self.directory  # where the manifest's files are (see load_state_dict)
        self.round_idx = 0
        self.bytes_written = 0  # since the last checkpoint

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
        """The client's state, or None if it has none."""
        path = self._file(client_id)
        return None if path is None else torch.load(path, weights_only=True)

    def put(self, client_id: int, state: Any) -> None:
        """Write the client's new state now (None: it keeps none)."""
        if state is None:
            if client_id in self.manifest or self.pending.get(client_id) is not None:
                self.pending[client_id] = None
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / _name(client_id, self.round_idx)
        _save(path, state)
        self.bytes_written += path.stat().st_size
        self.pending[client_id] = self.round_idx

    def client_ids(self) -> list[int]:
        """The clients that hold a state, in order."""
        return sorted(c for c in {*self.manifest, *self.pending} if self._file(c) is not None)

    def state_dict(self) -> dict[int, int]:
        """The manifest a checkpoint records: client -> round of its state's file (the states
        written so far this round included)."""
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
