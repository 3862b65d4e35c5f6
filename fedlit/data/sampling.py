"""Per-round client sampling, deterministic in (seed, round) and free of global RNG state."""

from __future__ import annotations

import numpy as np

__all__ = ["SAMPLING_TAG", "sample_clients", "visit_number"]

SAMPLING_TAG = 0x5A3D_C11E  # keeps the sampling stream apart from the data split and partition


def _check_sampling_args(num_clients: int, per_round: int, seed: int, round_idx: int) -> None:
    """Raise ValueError, naming the key, unless the arguments of a client draw are valid."""
    for name, value in (
        ("data.num_clients", num_clients),
        ("federation.clients_per_round", per_round),
        ("seed", seed),
        ("round_idx", round_idx),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if num_clients < 1:
        raise ValueError(f"data.num_clients must be >= 1, got {num_clients}")
    if not 1 <= per_round <= num_clients:
        raise ValueError(
            f"federation.clients_per_round must be in [1, data.num_clients={num_clients}], "
            f"got {per_round}"
        )
    if seed < 0 or round_idx < 0:
        raise ValueError(f"seed and round_idx must be >= 0, got seed={seed}, round={round_idx}")


def sample_clients(num_clients: int, per_round: int, seed: int, round_idx: int) -> np.ndarray:
    """Choose ``per_round`` of ``num_clients`` clients uniformly without replacement.

    The draw depends only on (seed, round_idx): not on earlier rounds or any global RNG.
    Returns a sorted int64 array of shape (per_round,) with ids in [0, num_clients).
    """
    _check_sampling_args(num_clients, per_round, seed, round_idx)
    rng = np.random.default_rng([int(seed), int(round_idx), SAMPLING_TAG])
    chosen = rng.choice(num_clients, size=per_round, replace=False)
    return np.sort(chosen).astype(np.int64)


def visit_number(
    client_id: int, num_clients: int, per_round: int, seed: int, round_idx: int
) -> int:
    """How many of rounds 1..``round_idx`` (inclusive) :func:`sample_clients` chose ``client_id``.

    In a round that selects the client, this is the ``visit`` to pass to the data module's
    client loaders (1 on its first selection); 0 when it has not been selected yet.
    """
    _check_sampling_args(num_clients, per_round, seed, round_idx)
    if isinstance(client_id, bool) or not isinstance(client_id, (int, np.integer)):
        raise ValueError(f"client_id must be an integer, got {client_id!r}")
    if not 0 <= client_id < num_clients:
        raise ValueError(
            f"client_id must be in [0, data.num_clients={num_clients}), got {client_id}"
        )
    if per_round == num_clients:
        return int(round_idx)
    return sum(
        int(client_id in sample_clients(num_clients, per_round, seed, r))
        for r in range(1, round_idx + 1)
    )
