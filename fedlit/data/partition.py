"""Partitioners that divide the unlabeled client pool among clients, and the non-iid metric R.

A partitioner is called with the pool's labels and returns one index array per client: int64,
sorted, positions into ``labels``, pairwise disjoint. All randomness comes from the ``rng``
argument, so the same seed gives the same partition. NumPy only.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

__all__ = [
    "IID",
    "SSFL",
    "ClassesPerClient",
    "Dirichlet",
    "Partitioner",
    "RandomProportions",
    "class_counts",
    "non_iid_metric",
]

_EPS = 1e-9  # absorbs float noise before flooring (e.g. 71.9999999999 -> 72)
_MAX_DIRICHLET_ATTEMPTS = 1000


# ----------------------------------------------------------------------------- helpers


def _check_int(value: object, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value}")
    return int(value)


def _check_pool(
    labels: np.ndarray, num_clients: int, num_classes: int, examples_per_client: int | None
) -> np.ndarray:
    """Validate the call arguments; returns labels as an int64 array of shape (N,)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must hold integer class ids, got dtype {labels.dtype}")
    _check_int(num_classes, "data.num_classes", 1)
    _check_int(num_clients, "data.num_clients", 1)
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
        _check_int(examples_per_client, "data.examples_per_client", 1)
        need = num_clients * examples_per_client
        if need > labels.size:
            raise ValueError(
                f"data.examples_per_client={examples_per_client} x data.num_clients={num_clients}"
                f" = {need} exceeds the {labels.size} examples in the client pool"
            )
    return labels


def _class_pools(
    labels: np.ndarray, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffled positions of each class: a list of num_classes int64 arrays."""
    order = np.argsort(labels, kind="stable")
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return [rng.permutation(p) for p in np.split(order, bounds)]


def _assign(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
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


def _largest_remainder(values: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
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


def _round_matrix(
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


# ----------------------------------------------------------------------------- partitioners


class Partitioner(ABC):
    """Divides the client pool among ``num_clients`` clients."""

    @abstractmethod
    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        examples_per_client: int | None = None,
    ) -> list[np.ndarray]:
        """labels: (N,) int class ids of the client pool. Returns num_clients index arrays
        (int64, sorted, positions into `labels`), pairwise disjoint (every example used at most
        once). examples_per_client=None: the whole pool is divided among the clients; an int: each
        client gets exactly that many (fewer than the pool may be used)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class IID(Partitioner):
    """Stratified split: every client gets (up to rounding) the pool's class proportions.

    With ``examples_per_client`` n the pool is first subsampled, stratified, to K * n examples and
    every client gets exactly n; otherwise the whole pool is used and client sizes differ by at most
    one. Per-class counts are floor or ceil of their exact share (largest-remainder rounding).
    """

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        examples_per_client: int | None = None,
    ) -> list[np.ndarray]:
        """labels: (N,) -> num_clients sorted int64 index arrays."""
        labels = _check_pool(labels, num_clients, num_classes, examples_per_client)
        pools = _class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        total_pool = int(pool_counts.sum())
        if examples_per_client is None:
            cols = pool_counts
            rows = _largest_remainder(
                np.full(num_clients, total_pool / num_clients), total_pool, rng
            )
        else:
            used = num_clients * examples_per_client
            cols = _largest_remainder(pool_counts * (used / total_pool), used, rng)
            rows = np.full(num_clients, examples_per_client, dtype=np.int64)
        target = np.tile(cols / num_clients, (num_clients, 1))
        counts = _round_matrix(target, rows, cols, rng)
        return _assign(pools, counts)


class _ProportionalSkew(Partitioner):
    """Label skew from per-client class proportions drawn at random (:meth:`_proportions`).

    With ``examples_per_client`` n: each client in turn draws class proportions p_k and takes
    round(n * p_k) examples per class (largest remainder, exact total n) from what is still
    available; when a class runs out, the deficit is spread over the classes still available in
    proportion to p_k. Without it: every class's examples are split over the clients by
    proportions drawn over the K clients, redrawn until no client is empty.
    """

    @abstractmethod
    def _proportions(self, size: int, rng: np.random.Generator, count: int) -> np.ndarray:
        """(count, size) rows, each non-negative and summing to 1."""

    def _empty_hint(self) -> str:
        """What to change when the whole-pool split keeps leaving a client empty."""
        return "decrease data.num_clients, or set data.examples_per_client"

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        examples_per_client: int | None = None,
    ) -> list[np.ndarray]:
        """labels: (N,) -> num_clients sorted int64 index arrays."""
        labels = _check_pool(labels, num_clients, num_classes, examples_per_client)
        pools = _class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        if examples_per_client is None:
            counts = self._split_whole_pool(pool_counts, num_clients, rng)
        else:
            counts = self._fill_clients(pool_counts, num_clients, examples_per_client, rng)
        return _assign(pools, counts)

    def _split_whole_pool(
        self, pool_counts: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> np.ndarray:
        num_classes = pool_counts.shape[0]
        for _ in range(_MAX_DIRICHLET_ATTEMPTS):
            props = self._proportions(num_clients, rng, num_classes)  # (d, K)
            counts = np.stack(
                [
                    _largest_remainder(n_c * props[c], int(n_c), rng)
                    for c, n_c in enumerate(pool_counts)
                ],
                axis=1,
            )
            if (counts.sum(axis=1) > 0).all():
                return counts
        raise ValueError(
            f"{type(self).__name__} partition left some client empty in "
            f"{_MAX_DIRICHLET_ATTEMPTS} draws (data.num_clients={num_clients}, pool of "
            f"{int(pool_counts.sum())} examples); {self._empty_hint()}"
        )

    def _fill_clients(
        self, pool_counts: np.ndarray, num_clients: int, n: int, rng: np.random.Generator
    ) -> np.ndarray:
        num_classes = pool_counts.shape[0]
        avail = pool_counts.astype(np.int64).copy()
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        props = self._proportions(num_classes, rng, num_clients)  # (K, d)
        for k in range(num_clients):
            p = props[k]
            take = np.minimum(_largest_remainder(n * p, n, rng), avail)
            deficit = n - int(take.sum())
            while deficit > 0:
                room = avail - take
                weights = np.where(room > 0, p, 0.0)
                if weights.sum() <= 0:
                    weights = room.astype(np.float64)
                extra = _largest_remainder(deficit * weights / weights.sum(), deficit, rng)
                extra = np.minimum(np.where(room > 0, extra, 0), room)
                if extra.sum() == 0:  # cannot happen with consistent inputs; never loop forever
                    extra = np.minimum(room, deficit)
                    extra[np.cumsum(extra) > deficit] = 0
                take += extra
                deficit = n - int(take.sum())
            avail -= take
            counts[k] = take
        return counts


class Dirichlet(_ProportionalSkew):
    """Label skew by a Dirichlet prior (Hsu et al. 2019, as used by FedSup / FedSwitch).

    Each client's class proportions are p_k ~ Dir(alpha * 1_d) (see :class:`_ProportionalSkew`
    for how a shard is filled); without ``examples_per_client`` every class's examples are split
    over the clients by proportions ~ Dir(alpha * 1_K). Small alpha = strong skew; alpha = 1e5
    is practically IID.

    Args:
        alpha: concentration of the Dirichlet prior, > 0.
    """

    def __init__(self, alpha: float) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
            raise ValueError(f"data.partitioner.alpha must be a number, got {alpha!r}")
        if not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"data.partitioner.alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)

    def _proportions(self, size: int, rng: np.random.Generator, count: int) -> np.ndarray:
        """(count, size) rows drawn from Dir(alpha * 1_size), made safe against underflow."""
        p = rng.dirichlet(np.full(size, self.alpha), size=count)
        p = np.nan_to_num(p, nan=0.0, posinf=0.0, neginf=0.0)
        s = p.sum(axis=1, keepdims=True)
        bad = s[:, 0] <= 0
        if bad.any():  # all mass underflowed: put it on one random entry
            p[bad] = 0.0
            p[np.flatnonzero(bad), rng.integers(size, size=int(bad.sum()))] = 1.0
            s = p.sum(axis=1, keepdims=True)
        return p / s

    def _empty_hint(self) -> str:
        return f"increase data.partitioner.alpha (now {self.alpha}), " + super()._empty_hint()


class RandomProportions(_ProportionalSkew):
    """Paper 002's non-IID split (section 5.1): "the class distribution is randomly generated"
    for each client. Client k draws one weight per class, u_kc ~ U(0, 1) independently, and its
    class proportions are p_kc = u_kc / sum_c u_kc; its shard of ``examples_per_client`` is
    filled to them (see :class:`_ProportionalSkew`). Without ``examples_per_client`` each class
    is split over the clients in proportion to uniform weights drawn for it.

    Milder than Dirichlet(1) (which normalises Exp(1) draws): with 10 classes the expected
    largest share of a client is about 0.19 against 0.29, and every class has a share.
    """

    def _proportions(self, size: int, rng: np.random.Generator, count: int) -> np.ndarray:
        """(count, size) rows of U(0, 1) draws, each normalised to sum 1."""
        u = rng.random((count, size))
        u[u.sum(axis=1) <= 0] = 1.0  # (practically impossible) an all-zero draw: uniform
        return u / u.sum(axis=1, keepdims=True)


class ClassesPerClient(Partitioner):
    """FedCon's non-IID split: every client holds exactly ``n`` distinct classes.

    The K * n (client, class) slots are spread over the classes as evenly as possible (each class
    is held by floor or ceil of K * n / d clients; the extra holders go to the classes with the
    most examples, ties at random);
    clients, in random order, pick the n classes with the most slots left (ties at random).
    Without ``examples_per_client`` each class's examples are divided evenly among its holders
    (classes no client holds are unused); with it, a client takes examples_per_client / n from
    each of its classes, the remainder going to its classes with the most examples left.

    Args:
        n: classes per client, 1 <= n <= num_classes.
    """

    def __init__(self, n: int = 2) -> None:
        self.n = _check_int(n, "data.partitioner.n", 1)

    def holdings(
        self,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        class_sizes: np.ndarray | None = None,
    ) -> np.ndarray:
        """(K, d) bool matrix: which classes each client holds (exactly n per row).

        class_sizes: optional (d,) pool counts; classes with more examples get the extra holders.
        """
        if self.n > num_classes:
            raise ValueError(
                f"data.partitioner.n must be <= the number of classes ({num_classes}), got {self.n}"
            )
        slots = num_clients * self.n
        quota = np.full(num_classes, slots // num_classes, dtype=np.int64)
        sizes = np.zeros(num_classes) if class_sizes is None else np.asarray(class_sizes)
        quota[np.lexsort((rng.random(num_classes), -sizes))[: slots % num_classes]] += 1
        held = np.zeros((num_clients, num_classes), dtype=bool)
        for k in rng.permutation(num_clients):
            chosen = np.lexsort((rng.random(num_classes), -quota))[: self.n]
            if (quota[chosen] <= 0).any():
                raise RuntimeError("class assignment ran out of slots")
            quota[chosen] -= 1
            held[k, chosen] = True
        return held

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        examples_per_client: int | None = None,
    ) -> list[np.ndarray]:
        """labels: (N,) -> num_clients sorted int64 index arrays."""
        labels = _check_pool(labels, num_clients, num_classes, examples_per_client)
        if examples_per_client is not None and examples_per_client < self.n:
            raise ValueError(
                f"data.examples_per_client={examples_per_client} is smaller than "
                f"data.partitioner.n={self.n}; a client could not hold {self.n} classes"
            )
        pools = _class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        held = self.holdings(num_clients, num_classes, rng, pool_counts)
        holders = held.sum(axis=0)
        short = np.flatnonzero(pool_counts < holders)
        if short.size:
            first = int(short[0])
            raise ValueError(
                f"class {first} has {pool_counts[first]} examples but is held by "
                f"{holders[first]} clients "
                f"(data.partitioner.n={self.n}, data.num_clients={num_clients})"
            )
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        if examples_per_client is None:
            for c in np.flatnonzero(holders):
                who = np.flatnonzero(held[:, c])
                share = np.full(who.size, pool_counts[c] / who.size)
                counts[who, c] = _largest_remainder(share, int(pool_counts[c]), rng)
        else:
            base, extra = divmod(examples_per_client, self.n)
            avail = pool_counts - base * holders
            if (avail < 0).any():
                low = int(np.flatnonzero(avail < 0)[0])
                raise ValueError(
                    f"class {low} has {pool_counts[low]} examples, fewer than the "
                    f"{base * holders[low]} its {holders[low]} holders need; lower "
                    "data.examples_per_client or data.num_clients"
                )
            counts[held] = base
            for k in range(num_clients):
                if extra == 0:
                    break
                mine = np.flatnonzero(held[k])
                pick = mine[np.lexsort((rng.random(mine.size), -avail[mine]))[:extra]]
                if (avail[pick] <= 0).any():
                    raise ValueError(
                        "the client pool has too few examples of some class for "
                        f"data.examples_per_client={examples_per_client} with "
                        f"data.partitioner.n={self.n}"
                    )
                counts[k, pick] += 1
                avail[pick] -= 1
        return _assign(pools, counts)


class SSFL(Partitioner):
    """Main-class split with a target non-iid level R = r (paper 004, Appendix A.2).

    The paper's procedure, with the server's share already removed from the pool:

        "Assume there are n_j samples left in class j after distributing the data to the server.
        We assume there are m_j users [...] who use class j as the main class [...]
        (a) We first assign n_j * R / m_j unlabeled training samples for the main class j.
        (b) After that, for each class i from {1, ..., d}, we assign n_i * q_j * (1 - R) / m_j
        unlabeled samples."

    Here user k's main class is k mod d (so num_clients >= num_classes), q is the pool's class
    frequency vector and, when ``examples_per_client`` n is given, the pool is first subsampled,
    stratified, to K * n examples (client sizes are then N q_j / m_j, i.e. exactly n when the
    pool is balanced and d divides K). Every class's examples are allocated exactly; each
    count is floor or ceil of its real-valued share (largest-remainder rounding per class, which
    also keeps client sizes at floor or ceil of theirs). For K = d and a balanced pool the realised
    metric R (Definition 1) equals r up to rounding.

    Args:
        r: target non-iid level in [0, 1]; 0 = IID, 1 = only the main class.
    """

    def __init__(self, r: float) -> None:
        if isinstance(r, bool) or not isinstance(r, (int, float, np.floating, np.integer)):
            raise ValueError(f"data.partitioner.r must be a number, got {r!r}")
        if not math.isfinite(r) or not 0.0 <= r <= 1.0:
            raise ValueError(f"data.partitioner.r must be in [0, 1], got {r}")
        self.r = float(r)

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        num_classes: int,
        rng: np.random.Generator,
        examples_per_client: int | None = None,
    ) -> list[np.ndarray]:
        """labels: (N,) -> num_clients sorted int64 index arrays."""
        labels = _check_pool(labels, num_clients, num_classes, examples_per_client)
        if num_clients < num_classes:
            raise ValueError(
                f"SSFL gives user k the main class k mod d, so every class needs a main user: "
                f"data.num_clients ({num_clients}) must be >= the number of classes "
                f"({num_classes})"
            )
        pools = _class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        if examples_per_client is None:
            cols = pool_counts
        else:
            used = num_clients * examples_per_client
            cols = _largest_remainder(pool_counts * (used / pool_counts.sum()), used, rng)
        total = int(cols.sum())
        q = cols / total
        main = np.arange(num_clients) % num_classes
        m = np.bincount(main, minlength=num_classes)
        target = ((1.0 - self.r) * q[main] / m[main])[:, None] * cols[None, :].astype(np.float64)
        target[np.arange(num_clients), main] += cols[main] * self.r / m[main]
        rows = _largest_remainder(target.sum(axis=1), total, rng)
        counts = _round_matrix(target, rows, cols, rng)
        empty = np.flatnonzero(counts.sum(axis=1) == 0)
        if empty.size:
            k = int(empty[0])
            raise ValueError(
                f"SSFL left client {k} empty: the pool has no examples of its main class "
                f"{main[k]} (data.partitioner.r={self.r})"
            )
        return _assign(pools, counts)


# ----------------------------------------------------------------------------- statistics


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
