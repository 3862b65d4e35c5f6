"""Partitioners that divide the unlabeled client pool among clients, and the non-iid metric R
(:mod:`fedlit.data.allocation`, re-exported here with the class counts).

A partitioner is called with the pool's labels and returns one index array per client: int64,
sorted, positions into ``labels``, pairwise disjoint. All randomness comes from the ``rng``
argument, so the same seed gives the same partition. NumPy only.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from fedlit.data.allocation import (
    assign,
    check_int,
    check_pool,
    class_counts,
    class_pools,
    largest_remainder,
    non_iid_metric,
    round_matrix,
)

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

_MAX_DIRICHLET_ATTEMPTS = 1000


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
        labels = check_pool(labels, num_clients, num_classes, examples_per_client)
        pools = class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        total_pool = int(pool_counts.sum())
        if examples_per_client is None:
            cols = pool_counts
            rows = largest_remainder(
                np.full(num_clients, total_pool / num_clients), total_pool, rng
            )
        else:
            used = num_clients * examples_per_client
            cols = largest_remainder(pool_counts * (used / total_pool), used, rng)
            rows = np.full(num_clients, examples_per_client, dtype=np.int64)
        target = np.tile(cols / num_clients, (num_clients, 1))
        counts = round_matrix(target, rows, cols, rng)
        return assign(pools, counts)


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
        labels = check_pool(labels, num_clients, num_classes, examples_per_client)
        pools = class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        if examples_per_client is None:
            counts = self._split_whole_pool(pool_counts, num_clients, rng)
        else:
            counts = self._fill_clients(pool_counts, num_clients, examples_per_client, rng)
        return assign(pools, counts)

    def _split_whole_pool(
        self, pool_counts: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> np.ndarray:
        num_classes = pool_counts.shape[0]
        for _ in range(_MAX_DIRICHLET_ATTEMPTS):
            props = self._proportions(num_clients, rng, num_classes)  # (d, K)
            counts = np.stack(
                [
                    largest_remainder(n_c * props[c], int(n_c), rng)
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
            take = np.minimum(largest_remainder(n * p, n, rng), avail)
            deficit = n - int(take.sum())
            while deficit > 0:
                room = avail - take
                weights = np.where(room > 0, p, 0.0)
                if weights.sum() <= 0:
                    weights = room.astype(np.float64)
                extra = largest_remainder(deficit * weights / weights.sum(), deficit, rng)
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
        self.n = check_int(n, "data.partitioner.n", 1)

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
        labels = check_pool(labels, num_clients, num_classes, examples_per_client)
        if examples_per_client is not None and examples_per_client < self.n:
            raise ValueError(
                f"data.examples_per_client={examples_per_client} is smaller than "
                f"data.partitioner.n={self.n}; a client could not hold {self.n} classes"
            )
        pools = class_pools(labels, num_classes, rng)
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
                counts[who, c] = largest_remainder(share, int(pool_counts[c]), rng)
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
        return assign(pools, counts)


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
        labels = check_pool(labels, num_clients, num_classes, examples_per_client)
        if num_clients < num_classes:
            raise ValueError(
                f"SSFL gives user k the main class k mod d, so every class needs a main user: "
                f"data.num_clients ({num_clients}) must be >= the number of classes "
                f"({num_classes})"
            )
        pools = class_pools(labels, num_classes, rng)
        pool_counts = np.array([len(p) for p in pools], dtype=np.int64)
        if examples_per_client is None:
            cols = pool_counts
        else:
            used = num_clients * examples_per_client
            cols = largest_remainder(pool_counts * (used / pool_counts.sum()), used, rng)
        total = int(cols.sum())
        q = cols / total
        main = np.arange(num_clients) % num_classes
        m = np.bincount(main, minlength=num_classes)
        target = ((1.0 - self.r) * q[main] / m[main])[:, None] * cols[None, :].astype(np.float64)
        target[np.arange(num_clients), main] += cols[main] * self.r / m[main]
        rows = largest_remainder(target.sum(axis=1), total, rng)
        counts = round_matrix(target, rows, cols, rng)
        empty = np.flatnonzero(counts.sum(axis=1) == 0)
        if empty.size:
            k = int(empty[0])
            raise ValueError(
                f"SSFL left client {k} empty: the pool has no examples of its main class "
                f"{main[k]} (data.partitioner.r={self.r})"
            )
        return assign(pools, counts)
