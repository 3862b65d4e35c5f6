"""The arithmetic of a partition: the checks of a partitioner's call, each class's shuffled
positions, counts rounded to exact totals and handed out, and the statistics of a partition
(the class counts and the non-iid metric R). The partitioners (:mod:`fedlit.data.partition`)
are built on it. NumPy only; all randomness comes from the ``rng`` argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EPS = 1e-9  # absorbs float noise before flooring (e.g. 71.9999999999 -> 72)


def check_int(value: object, key: str, minimum: int) -> int:
    """``value`` as an int; ValueError, naming ``key``, unless it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value}")
    return int(value)


def check_pool(
    labels: np.ndarray, num_clients: int, num_classes: int, examples_per_client: int | None
) -> np.ndarray:
    """Validate the call arguments; returns labels as an int64 array of shape (N,)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must hold integer class ids, got dtype {labels.dtype}")
    check_int(num_classes, "data.num_classes", 1)
    check_int(num_clients, "data.num_clients", 1)
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]"
        )
    if examples_per_client is None:
        if labels.size < num_clients:
            raise ValueError(
                f"the client pool has {labels.size} examples, fewer than data.num_clients="
                f"{num_clients}; every client needs at least one"
            )
    else:
        check_int(examples_per_client, "data.examples_per_client", 1)
        need = num_clients * examples_per_client
        if need > labels.size:
            raise ValueError(
                f"data.examples_per_client={examples_per_client} x data.num_clients={num_clients}"
                f" = {need} exceeds the {labels.size} examples in the client pool"
            )
    return labels


def class_pools(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled positions of each class: a list of num_classes int64 arrays."""
    order = np.argsort(labels, kind="stable")
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return [rng.permutation(p) for p in np.split(order, bounds)]


def assign(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Give client k the next ``counts[k, c]`` examples of every class c.

    pools: per-class shuffled positions; counts: (K, d) int. Returns K sorted int64 arrays.
    """
    num_clients = counts.shape[0]
    idx, owner = [], []
    for c, pool in enumerate(pools):
        col = counts[:, c]
        total = int(col.sum())
        if total > len(pool):
            raise RuntimeError(f"class {c}: {total} examples allocated, only {len(pool)} exist")
        idx.append(pool[:total])
        owner.append(np.repeat(np.arange(num_clients), col))
    all_idx = np.concatenate(idx).astype(np.int64)
    all_owner = np.concatenate(owner)
    order = np.lexsort((all_idx, all_owner))
    sizes = np.bincount(all_owner, minlength=num_clients)
    return [np.ascontiguousarray(p) for p in np.split(all_idx[order], np.cumsum(sizes)[:-1])]


def largest_remainder(values: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Round non-negative ``values`` (shape (n,), sum ~ total) to ints summing exactly to total.

    Floors everything, then gives +1 to the largest fractional parts (ties broken at random).
    """
    values = np.asarray(values, dtype=np.float64)
    base = np.maximum(np.floor(values + _EPS), 0.0)
    frac = values - base
    rem = int(total - base.sum())
    tie = rng.random(values.shape[0])
    if rem > 0:
        if rem > values.shape[0]:
            raise RuntimeError(f"cannot round {values.sum()} to {total}")
        base[np.lexsort(np.stack([tie, -frac]))[:rem]] += 1
    elif rem < 0:  # only float noise can get here
        cand = np.lexsort(np.stack([tie, frac]))
        cand = cand[base[cand] > 0][:-rem]
        base[cand] -= 1
    return base.astype(np.int64)


def round_matrix(
    target: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Round a non-negative (K, d) matrix to ints with exact column sums ``col_totals`` (d,).

    Every entry becomes floor or floor + 1 of its target. The leftover units of each column go to
    the rows still furthest below ``row_totals`` (K,), then to the largest fractional parts, then
    at random; this is the constructive Gale-Ryser fill, so the row sums are met exactly whenever
    some such rounding exists (always when the row totals are the exact row sums of ``target``).
    """
    base = np.maximum(np.floor(target + _EPS), 0.0).astype(np.int64)
    frac = target - base
    row_need = np.asarray(row_totals, dtype=np.int64) - base.sum(axis=1)
    col_need = np.asarray(col_totals, dtype=np.int64) - base.sum(axis=0)
    num_rows = target.shape[0]
    if (col_need < 0).any() or (col_need > num_rows).any():
        raise RuntimeError("column totals are inconsistent with the target matrix")
    for c in np.flatnonzero(col_need):
        order = np.lexsort(np.stack([rng.random(num_rows), -frac[:, c], -row_need]))
        chosen = order[: col_need[c]]
        base[chosen, c] += 1
        row_need[chosen] -= 1
    return base


def class_counts(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client class histogram: labels (N,), K index arrays -> (K, num_classes) int64."""
    labels = np.asarray(labels)
    parts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
    if not parts:
        return np.zeros((0, num_classes), dtype=np.int64)
    sizes = np.array([p.size for p in parts], dtype=np.int64)
    y = labels[np.concatenate(parts)].astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{y.min()}, {y.max()}]")
    owner = np.repeat(np.arange(len(parts)), sizes)
    flat = np.bincount(owner * num_classes + y, minlength=len(parts) * num_classes)
    return flat.reshape(len(parts), num_classes).astype(np.int64)


def non_iid_metric(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> float:
    """Non-iid level R of a partition (paper 004, Definition 1, eq 1).

    R = 2 / (K (K - 1)) * sum_{k < m} ||P_k - P_m||_1 / 2, P_k = client k's class distribution
    (d,). 0 = identical distributions, 1 = disjoint supports (e.g. K = d, one class each).
    Computed per class from the sorted column of P in O(K d log K). K = 1 gives 0.0.
    Raises ValueError if there are no clients or a client is empty.
    """
    counts = class_counts(labels, parts, num_classes)
    num_clients = counts.shape[0]
    if num_clients == 0:
        raise ValueError("non_iid_metric needs at least one client")
    sizes = counts.sum(axis=1)
    if (sizes == 0).any():
        raise ValueError(f"clients {np.flatnonzero(sizes == 0).tolist()} are empty; R is undefined")
    if num_clients == 1:
        return 0.0
    probs = np.sort(counts / sizes[:, None], axis=0)  # (K, d), each column ascending
    # sum_{k<m} |x_k - x_m| over a sorted column = sum_i x_(i) (2 i - K + 1), i = 0..K-1
    weights = 2.0 * np.arange(num_clients) - num_clients + 1
    pair_l1 = float((weights[:, None] * probs).sum())
    return min(max(pair_l1 / (num_clients * (num_clients - 1)), 0.0), 1.0)  # clip float noise
