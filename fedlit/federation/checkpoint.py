"""The federation checkpoint: everything needed to continue a run exactly."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from fedlit.run_layout import current_keys

#: The method's whole state is ``method.state_dict()`` (networks, teachers, targets, buffers);
#: ``client_states`` is the manifest of the client-state files in ``clients/`` beside the file
#: (:mod:`fedlit.federation.store`).
FORMAT = "fedlit-federation/4"
#: Earlier formats, refused with what changed since.
EARLIER = {
    "fedlit-federation/1": "before methods kept their state as module state",
    "fedlit-federation/2": "before a method's optimiser and loss settings became the config "
    "groups model.init_args.optim and model.init_args.loss, so its stored settings would not "
    "be compared",
    "fedlit-federation/3": "before client states moved out of the checkpoint into one file "
    "per client beside it",
}


#: The exit status of ``fedlit fit`` when a file of the run cannot be written (a full disk).
WRITE_FAILED = 1


class WriteFailed(OSError):
    """A run's file could not be written (a full disk, a quota, an I/O error): the message
    names the file and the free space left on its file system. What was there before is
    intact (files are written to a temporary name, which is removed, and renamed)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"could not write {path}: {reason}; {free_space(path)}")
        self.path = path


def free_space(path: Path) -> str:
    """``"<n> MiB free on <its file system>"`` for the folder of ``path``, as far as known."""
    folder = Path(path).parent
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "the free space of its file system is unknown"
    return f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.0f} MiB in {folder}"


#: What torch's C++ file writer says when a write fails (measured on a full device: the first
#: for a large payload, the last for a small one).
TORCH_WRITE_ERRORS = ("inline_container", "PytorchStreamWriter", "iostream error")


def write_error(err: BaseException) -> str | None:
    """The reason, if ``err`` is a failed write: an OSError, or torch's RuntimeError from its
    file writer (:data:`TORCH_WRITE_ERRORS`, which carries no errno); None for anything
    else."""
    if isinstance(err, OSError):
        if err.errno == errno.ENOSPC:
            return "no space left on the device"
        return err.strerror or str(err)
    text = str(err)
    if isinstance(err, RuntimeError) and any(mark in text for mark in TORCH_WRITE_ERRORS):
        return f"torch.save failed ({text.strip().splitlines()[0]})"
    return None


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to ``<path>.tmp``, then rename it to ``path``: a crash or a failed write
    leaves the previous ``path`` intact. A failed write (:func:`write_error`) removes the
    temporary file and raises :class:`WriteFailed` naming ``path`` and the free space."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        reason = write_error(err)
        if reason is None:
            raise
        raise WriteFailed(path, reason) from err


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically: a crash leaves the previous file intact, and a
    failed write (a full disk) raises :class:`WriteFailed` and leaves no ``.tmp`` file.

    The payload must hold only tensors, numbers, strings and containers of them, so that it
    loads with ``torch.load(weights_only=True)`` (no pickled code runs when a file is read).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: torch.save({"format": FORMAT, **payload}, tmp))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a federation checkpoint; a ValueError names the path if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"federation.resume / ckpt_path: no checkpoint file at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a torch file, or one holding arbitrary objects
        raise ValueError(
            f"{path} is not a fedlit federation checkpoint (torch.load(weights_only=True) "
            f"failed: {type(err).__name__})"
        ) from err
    earlier = ckpt.get("format") if isinstance(ckpt, dict) else None
    if earlier in EARLIER:
        raise ValueError(
            f"{path} was written by an earlier fedlit ({earlier}, {EARLIER[earlier]}) and "
            f"cannot be loaded by this one ({FORMAT}); start the run again"
        )
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{path} is not a fedlit federation checkpoint ({FORMAT})")
    return ckpt


@dataclass
class RunCheckpoint:
    """What ``checkpoints/last.ckpt`` holds: everything needed to continue a run exactly. Its
    fields are the file's keys (besides ``format``), written in this order."""

    #: The last round the run finished.
    round: int
    #: The method's whole state (:meth:`~fedlit.methods.FederatedMethod.state_dict`).
    method_state: dict[str, Any]
    #: The client-state store's manifest: client -> round of its file in ``clients/``.
    client_states: dict[int, int]
    #: Client id -> the rounds it has been selected in.
    visits: dict[int, int]
    #: Each finished round's metrics.
    history: list[dict[str, float]]
    #: The global random generators' states (:func:`~fedlit.federation.seeding.rng_states`).
    rng: dict[str, Any]
    #: Who made it: seed, method, number of clients, data set (a resume must match them).
    meta: dict[str, Any]
    #: The run's flat config (a resume compares its settings with them).
    hparams: dict[str, Any]
    #: fp16's gradient scalers of the method's networks, by module name
    #: (:func:`~fedlit.federation.fit.loop.scaler_states`); empty outside fp16 and in a
    #: checkpoint written before they were kept.
    scalers: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """Write it to ``path`` (:func:`save_checkpoint`: atomically, :class:`WriteFailed`
        when the disk is full)."""
        save_checkpoint(path, {f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def load(cls, path: str | Path) -> RunCheckpoint:
        """Read the checkpoint at ``path`` (:func:`load_checkpoint`); a ValueError names the
        path if it is not one or lacks a key. Its settings are under their keys now
        (:func:`~fedlit.run_layout.current_keys`: a run of an earlier fedlit resumes)."""
        ckpt = load_checkpoint(path)
        optional = {f.name for f in fields(cls) if f.default_factory is not MISSING}
        missing = [f.name for f in fields(cls) if f.name not in ckpt and f.name not in optional]
        if missing:
            raise ValueError(f"{path} is not a complete fedlit checkpoint (no {missing})")
        values = {f.name: ckpt[f.name] for f in fields(cls) if f.name in ckpt}
        return cls(**values | {"hparams": current_keys(values["hparams"] or {})})


def checkpoint_settings(path: Path) -> dict[str, Any]:
    """The flat config a federation checkpoint of any format records (``hparams``; its
    settings under their keys now, :func:`~fedlit.run_layout.current_keys`), empty where it
    records none: what a resume, and a comparison about to reuse the run, compare."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} is not a fedlit federation checkpoint: {err}") from err
    hparams = ckpt.get("hparams") if isinstance(ckpt, dict) else None
    return current_keys(dict(hparams)) if isinstance(hparams, dict) else {}


def checkpoint_round(path: Path) -> int:
    """The last round a federation checkpoint of any format finished (enough to tell a
    finished run from one to resume, also for runs written by an earlier fedlit)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} is not a fedlit federation checkpoint: {err}") from err
    fmt = ckpt.get("format") if isinstance(ckpt, dict) else None
    if not (isinstance(fmt, str) and fmt.startswith("fedlit-federation/")):
        raise ValueError(f"{path} is not a fedlit federation checkpoint")
    return int(ckpt["round"])
