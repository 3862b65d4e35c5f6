"""The federation checkpoint: everything needed to continue a run exactly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

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


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically: a crash leaves the previous file intact.

    The payload must hold only tensors, numbers, strings and containers of them, so that it
    loads with ``torch.load(weights_only=True)`` (no pickled code runs when a file is read).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": FORMAT, **payload}, tmp)
    os.replace(tmp, path)


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
