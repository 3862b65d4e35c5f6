"""Faults a round survives (a client that raises or uploads non-finite values) and those that stop
the run (too few clients left, a global model that is no longer finite)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: The exit status of ``fedlit fit`` when a round cannot go on (:class:`RoundFailed`); 2 is a
#: bad setting refused before anything runs, 143 a SIGTERM.
ROUND_FAILED = 3

#: ``fault/client_<id>``'s value: why the client was excluded.
FAULT_CODES = {"raised": 1.0, "nonfinite": 2.0}


class RoundFailed(RuntimeError):
    """A round that cannot go on: fewer clients than ``federation.min_clients`` survived it,
    or the global model is no longer finite. Nothing of the round is written (no metrics row,
    no checkpoint): the run's last checkpoint is its last good round."""


@dataclass(frozen=True)
class ClientFault:
    """A client excluded from a round: ``kind`` is "raised" (its work raised an exception) or
    "nonfinite" (its upload holds NaN or an infinity); ``detail`` says which."""

    client_id: int
    kind: str
    detail: str

    def describe(self) -> str:
        """One line: ``client 3 raised ValueError: ...`` / ``client 3 uploaded non-finite ...``."""
        verb = "raised" if self.kind == "raised" else "uploaded non-finite values in"
        return f"client {self.client_id} {verb} {self.detail}"


def nonfinite_tensors(state: Any, prefix: str = "") -> list[str]:
    """The names of the floating-point tensors in ``state`` (a tensor, or dicts, lists and
    tuples of them, nested; other values are skipped) that hold a NaN or an infinity, as
    dotted keys (list items as ``key.i``)."""
    return [name for name, tensor in _floating(state, prefix) if not torch.isfinite(tensor).all()]


def _floating(state: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() or state.is_complex():
            yield prefix, state.detach()
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from _floating(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from _floating(value, f"{prefix}.{i}" if prefix else str(i))


def upload_fault(client_id: int, upload: Any) -> ClientFault | None:
    """A fault if ``upload`` holds a non-finite value (naming up to three tensors), else None."""
    bad = nonfinite_tensors(upload)
    if not bad:
        return None
    return ClientFault(client_id, "nonfinite", name_list(bad))


def fault_metrics(faults: Sequence[ClientFault]) -> dict[str, float]:
    """A round's fault metrics: ``fault/clients`` (how many were excluded, 0 in a clean round)
    and ``fault/client_<id>`` for each, valued by :data:`FAULT_CODES` (1: raised, 2:
    non-finite upload)."""
    metrics = {"fault/clients": float(len(faults))}
    metrics |= {f"fault/client_{f.client_id}": FAULT_CODES[f.kind] for f in faults}
    return metrics


def name_list(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` names, comma-separated, and how many more there are."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
