"""Faults a round survives (a client that raises, uploads non-finite values or whose worker process
dies on every attempt), those that stop the run (too few clients left, a global model that is
no longer finite), and the run's answer to SIGTERM (:func:`stop_on_sigterm`)."""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.federation.fit.trainer import TERMINATED

#: The exit status of ``fedlit fit`` when a round cannot go on (:class:`RoundFailed`); 2 is a
#: bad setting refused before anything runs, 143 a SIGTERM.
ROUND_FAILED = 3

#: ``fault/client_<id>``'s value: why the client was excluded.
FAULT_CODES = {"raised": 1.0, "nonfinite": 2.0, "died": 3.0}


class RoundFailed(RuntimeError):
    """A round that cannot go on: fewer clients than ``federation.min_clients`` survived it,
    or the global model is no longer finite. Nothing of the round is written (no metrics row,
    no checkpoint): the run's last checkpoint is its last good round."""


class WorkerDied(Exception):
    """A client's work whose worker process died on every attempt (a pool executor's result
    for that client: the client is left out of its round, kind "died").

    Args:
        exit_codes: each attempt's worker exit code (negative: the signal that killed it).
    """

    def __init__(self, exit_codes: Sequence[int | None]) -> None:
        self.exit_codes = list(exit_codes)
        super().__init__(self.exit_codes)

    def __str__(self) -> str:
        n = len(self.exit_codes)
        attempts = f"each of its {n} attempts" if n > 1 else "its only attempt"
        how = ", ".join(sorted({_exit_text(code) for code in self.exit_codes}))
        return f"on {attempts} ({how})"


def _exit_text(code: int | None) -> str:
    """A process's end as words: ``killed by SIGKILL``, ``exit status 1``."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass(frozen=True)
class ClientFault:
    """A client excluded from a round: ``kind`` is "raised" (its work raised an exception),
    "nonfinite" (its upload holds NaN or an infinity) or "died" (its worker process died on
    every attempt); ``detail`` says which."""

    client_id: int
    kind: str
    detail: str

    def describe(self) -> str:
        """One line: ``client 3 raised ValueError: ...`` / ``client 3 uploaded non-finite ...``
        / ``client 3's worker process died on each of its 4 attempts (killed by SIGKILL)``."""
        what = {
            "raised": " raised",
            "nonfinite": " uploaded non-finite values in",
            "died": "'s worker process died",
        }[self.kind]
        return f"client {self.client_id}{what} {self.detail}"


def nonfinite_tensors(state: Any, prefix: str = "") -> list[str]:
    """The names of the floating-point tensors in ``state`` (a tensor, or dicts, lists and
    tuples of them, nested; other values are skipped) that hold a NaN or an infinity, as
    dotted keys (list items as ``key.i``).

    A finite state costs a few ops and one host read: the infinity norm of all its tensors
    together (``torch.nn.utils.get_total_norm``: one fused norm per device and dtype), the
    largest absolute value, which is finite exactly when every element is (NaN propagates)
    and cannot overflow. Only a state that fails it is searched tensor by tensor."""
    named = [(name, tensor) for name, tensor in _floating(state, prefix) if tensor.numel()]
    if not named:
        return []
    with torch.no_grad():
        total = torch.nn.utils.get_total_norm([tensor for _, tensor in named], math.inf)
        if bool(total.isfinite()):
            return []
        return [name for name, tensor in named if not bool(torch.isfinite(tensor).all())]


def _floating(state: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() or state.is_complex():
            yield prefix, state
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


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While a run runs (in the main thread), make a SIGTERM stop it cleanly wherever it comes.

    Inside a Trainer's fit, Lightning's handler is the one installed (it calls this one after
    its own): the run stops at that fit's end (:mod:`fedlit.federation.fit.trainer`). Anywhere
    else (fedlit's loop, aggregation, writing metrics or a checkpoint, waiting for Ray's
    workers), the signal raises :class:`SIGTERMException` at once, so the run's ``finally``
    blocks run (a half-written file's temporary removed, Ray shut down, the lock released) and
    ``fedlit fit`` exits with status 143. Either way the last checkpoint is whole.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGTERM) is handler:  # not inside a Trainer's fit
            raise SIGTERMException(TERMINATED)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
