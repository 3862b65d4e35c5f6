"""Deterministic seeds for every unit of work, derived from (run seed, round, client)."""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
import torch

SERVER = -1  # the "client id" of the server's own steps
EVAL = -2
INIT = -3  # the global network's initialisation
FINETUNE = -4  # a server step after aggregation (paper 000's Algorithm 1)
CENTRAL = -5  # the centralized reference's step on the pooled client images


def derive_seed(seed: int, round_idx: int, who: int) -> int:
    """A 63-bit seed for the work of ``who`` (a client id, or SERVER, EVAL, INIT, FINETUNE,
    CENTRAL) in
    ``round_idx``."""
    # -3..-1 keep the ids they always had; later tags go far above any client id
    tag = who + 3 if who >= -3 else 2**40 - who
    ss = np.random.SeedSequence([seed, round_idx, tag])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@functools.cache
def _accelerator_present() -> bool:
    """Whether torch sees a device besides the CPU (CUDA, MPS, XPU, ...), asked once a process:
    with Lightning imported, each ask is an NVML probe (about 0.2 ms where it fails)."""
    return torch.accelerator.is_available()


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (all devices).

    Where torch sees no accelerator, only the CPU's generator is seeded: ``torch.manual_seed``
    would also queue a seeding of each device type for a later initialisation that cannot
    come here, each with a captured stack (about 0.5 ms a call, a fixed cost per client). The
    CPU generator's state is the same either way."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if _accelerator_present():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def rng_states() -> dict[str, Any]:
    """The global generators' states, as tensors and plain values (``weights_only`` loadable)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    key_tensor = torch.from_numpy(np.asarray(keys).astype(np.int64))
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, key_tensor, pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if _accelerator_present() and torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        # the GPUs both runs see: a resume that sees fewer than the checkpoint saw restores
        # those it has (a run trains on one; the others' generators draw nothing)
        for index, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
