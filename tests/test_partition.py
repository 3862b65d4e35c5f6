"""Tests for fedlit.data.partition: partitioners, class_counts and the non-iid metric R."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedlit.data.partition import (
    IID,
    SSFL,
    ClassesPerClient,
    Dirichlet,
    Partitioner,
    RandomProportions,
    class_counts,
    non_iid_metric,
)

D = 10


def balanced(per_class: int, num_classes: int = D, seed: int = 0) -> np.ndarray:
    """Shuffled labels, (num_classes * per_class,), every class exactly per_class times."""
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


def unbalanced(n: int = 3000, num_classes: int = D, seed: int = 1) -> np.ndarray:
    """Labels (n,) with skewed class frequencies, every class present."""
    rng = np.random.default_rng(seed)
    p = np.linspace(1.0, 4.0, num_classes)
    labels = rng.choice(num_classes, size=n, p=p / p.sum())
    labels[:num_classes] = np.arange(num_classes)
    return labels


def run(part: Partitioner, labels: np.ndarray, k: int, seed: int, n: int | None = None):
    return part(labels, k, D, np.random.default_rng(seed), n)


def assert_valid(parts: list[np.ndarray], n_pool: int, k: int) -> None:
    assert len(parts) == k
    for p in parts:
        assert p.dtype == np.int64
        assert p.ndim == 1
        assert (np.diff(p) > 0).all(), "indices must be sorted and unique"
        if p.size:
            assert p.min() >= 0 and p.max() < n_pool
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size, "clients must be disjoint"


PARTITIONERS = [
    IID(),
    Dirichlet(0.3),
    Dirichlet(1e5),
    ClassesPerClient(2),
    ClassesPerClient(3),
    SSFL(0.4),
    SSFL(1.0),
    RandomProportions(),
]
IDS = [repr(p) for p in PARTITIONERS]


# ----------------------------------------------------------------------------- common contract


@pytest.mark.parametrize("part", PARTITIONERS, ids=IDS)
@pytest.mark.parametrize("labels", [balanced(300), unbalanced()], ids=["balanced", "unbalanced"])
def test_whole_pool_valid(part: Partitioner, labels: np.ndarray) -> None:
    parts = run(part, labels, 20, seed=3)
    assert_valid(parts, labels.size, 20)
    assert all(p.size > 0 for p in parts)
    if not isinstance(part, ClassesPerClient):  # it may leave unheld classes unused
        assert sum(p.size for p in parts) == labels.size


@pytest.mark.parametrize("part", PARTITIONERS, ids=IDS)
@pytest.mark.parametrize("k,n", [(10, 250), (20, 120), (30, 97)])
def test_examples_per_client_exact(part: Partitioner, k: int, n: int) -> None:
    labels = balanced(400)
    parts = run(part, labels, k, seed=5, n=n)
    assert_valid(parts, labels.size, k)
    sizes = [p.size for p in parts]
    if (
        isinstance(part, SSFL) and k % D
    ):  # sizes follow N q_j / m_j: unequal when d does not divide K
        assert sum(sizes) == k * n
    else:
        assert sizes == [n] * k


@pytest.mark.parametrize("part", PARTITIONERS, ids=IDS)
@pytest.mark.parametrize("n", [None, 100])
def test_deterministic_for_seed(part: Partitioner, n: int | None) -> None:
    labels = unbalanced()
    a = run(part, labels, 12, seed=7, n=n)
    b = run(part, labels, 12, seed=7, n=n)
    c = run(part, labels, 12, seed=8, n=n)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_only_rng_argument_is_used() -> None:
    labels = unbalanced()
    np.random.seed(0)
    a = run(Dirichlet(0.5), labels, 10, seed=1)
    np.random.seed(123)
    b = run(Dirichlet(0.5), labels, 10, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("part", PARTITIONERS, ids=IDS)
def test_pool_validation(part: Partitioner) -> None:
    labels = balanced(10)
    with pytest.raises(ValueError, match="data.examples_per_client"):
        run(part, labels, 10, seed=0, n=11)  # 110 > 100 examples
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        part(np.array([0, 1, 10] * 10), 10, D, np.random.default_rng(0))
    with pytest.raises(ValueError, match="data.num_clients"):
        run(part, labels, 0, seed=0)


# ----------------------------------------------------------------------------- IID


def test_iid_exact_class_counts() -> None:
    labels = balanced(600)
    parts = run(IID(), labels, 5, seed=0, n=1000)
    np.testing.assert_array_equal(class_counts(labels, parts, D), np.full((5, D), 100))
    parts = run(IID(), labels, 50, seed=0, n=120)
    np.testing.assert_array_equal(class_counts(labels, parts, D), np.full((50, D), 12))


def test_iid_whole_pool_stratified() -> None:
    labels = unbalanced(3001)
    parts = run(IID(), labels, 7, seed=2)
    counts = class_counts(labels, parts, D)
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=D))
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()
    sizes = counts.sum(axis=1)
    assert sizes.max() - sizes.min() <= 1
    assert non_iid_metric(labels, parts, D) < 0.01


def test_iid_metric_zero() -> None:
    labels = balanced(600)
    parts = run(IID(), labels, 10, seed=4)
    assert non_iid_metric(labels, parts, D) == pytest.approx(0.0, abs=1e-12)


# ----------------------------------------------------------------------------- Dirichlet


@pytest.mark.parametrize("n", [None, 200])
def test_dirichlet_large_alpha_is_iid(n: int | None) -> None:
    labels = balanced(500)
    for seed in range(3):
        parts = run(Dirichlet(1e5), labels, 20, seed=seed, n=n)
        assert non_iid_metric(labels, parts, D) < 0.05


@pytest.mark.parametrize("n", [None, 100])
def test_dirichlet_small_alpha_is_skewed(n: int | None) -> None:
    labels = balanced(500)
    for seed in range(3):
        parts = run(Dirichlet(0.1), labels, 20, seed=seed, n=n)
        assert non_iid_metric(labels, parts, D) > 0.5


def test_dirichlet_uses_pool_when_classes_run_out() -> None:
    labels = balanced(100)  # 1000 examples, all of them requested
    parts = run(Dirichlet(0.05), labels, 10, seed=0, n=100)
    assert [p.size for p in parts] == [100] * 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_dirichlet_invalid_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        Dirichlet(alpha)


def test_dirichlet_impossible_raises() -> None:
    labels = np.zeros(10, dtype=np.int64)  # one class: at tiny alpha it lands on one client
    with pytest.raises(ValueError, match="alpha"):
        run(Dirichlet(1e-3), labels, 10, seed=0)


# ----------------------------------------------------------------------------- RandomProportions


def test_random_proportions_follow_uniform_draws() -> None:
    """Each client's counts are n x (its U(0, 1) weights, normalised), rounded: the draws are
    replayed from the same seed (one permutation per class, then one (K, d) uniform block)."""
    labels = balanced(1000)  # 1,000 per class: no class runs out for 5 clients x 200
    k, n, seed = 5, 200, 3
    parts = run(RandomProportions(), labels, k, seed=seed, n=n)
    replay = np.random.default_rng(seed)
    for c in range(D):
        replay.permutation(int((labels == c).sum()))
    u = replay.random((k, D))
    expected = n * u / u.sum(axis=1, keepdims=True)
    counts = class_counts(labels, parts, D)
    assert (counts.sum(axis=1) == n).all()
    assert (np.abs(counts - expected) < 1).all()  # floor or ceil of each exact share


def test_random_proportions_skew_between_iid_and_dirichlet_one() -> None:
    """Normalised uniforms are milder than Dirichlet(1) (normalised exponentials): with 10
    classes the largest share averages ~0.19 against ~0.29 (H_10 / 10), and R sits between
    the IID split's 0 and Dirichlet(1)'s."""
    labels = balanced(6000)
    shares, r_uniform, r_dirichlet = [], [], []
    for seed in range(4):
        parts = run(RandomProportions(), labels, 10, seed=seed, n=1200)
        counts = class_counts(labels, parts, D)
        shares.append(counts.max(axis=1) / 1200)
        r_uniform.append(non_iid_metric(labels, parts, D))
        dirichlet = run(Dirichlet(1.0), labels, 10, seed=seed, n=1200)
        r_dirichlet.append(non_iid_metric(labels, dirichlet, D))
    assert 0.15 < np.mean(shares) < 0.23
    assert 0.1 < np.mean(r_uniform) < np.mean(r_dirichlet)


# ----------------------------------------------------------------------------- ClassesPerClient


@pytest.mark.parametrize("k,n", [(5, None), (5, 1000), (20, None), (20, 250), (37, 101)])
def test_classes_per_client_two_classes(k: int, n: int | None) -> None:
    labels = balanced(600)
    parts = run(ClassesPerClient(2), labels, k, seed=1, n=n)
    counts = class_counts(labels, parts, D)
    assert ((counts > 0).sum(axis=1) == 2).all()
    holders = (counts > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1, "classes used as evenly as possible"
    if n is not None:
        nz = counts[counts > 0]
        assert nz.max() - nz.min() <= 1, "n / 2 per class, as evenly as possible"


def test_classes_per_client_even_split_of_class() -> None:
    labels = balanced(600)
    parts = run(ClassesPerClient(2), labels, 20, seed=0)  # each class held by 4 clients
    counts = class_counts(labels, parts, D)
    np.testing.assert_array_equal(np.sort(counts[counts > 0]), np.full(40, 150))


def test_classes_per_client_pairs_are_random() -> None:
    labels = balanced(600)
    parts = run(ClassesPerClient(2), labels, 100, seed=0, n=50)
    pairs = {tuple(np.flatnonzero(row)) for row in class_counts(labels, parts, D)}
    assert len(pairs) > 10


def test_classes_per_client_validation() -> None:
    with pytest.raises(ValueError, match="data.partitioner.n"):
        ClassesPerClient(0)
    with pytest.raises(ValueError, match="data.partitioner.n"):
        run(ClassesPerClient(11), balanced(50), 5, seed=0)


# ----------------------------------------------------------------------------- SSFL


@pytest.mark.parametrize("r", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("n", [None, 500])
def test_ssfl_realised_r(r: float, n: int | None) -> None:
    labels = balanced(600)
    parts = run(SSFL(r), labels, D, seed=0, n=n)
    assert non_iid_metric(labels, parts, D) == pytest.approx(r, abs=0.01)


def test_ssfl_counts_follow_paper() -> None:
    labels = balanced(600)
    parts = run(SSFL(0.4), labels, D, seed=0)
    counts = class_counts(labels, parts, D)
    # main class: 600 * 0.4 + 600 * 0.1 * 0.6 = 276; others: 600 * 0.1 * 0.6 = 36
    expected = np.full((D, D), 36) + np.diag(np.full(D, 240))
    np.testing.assert_array_equal(counts, expected)


def test_ssfl_one_class_per_client() -> None:
    labels = balanced(300)
    parts = run(SSFL(1.0), labels, D, seed=2)
    counts = class_counts(labels, parts, D)
    np.testing.assert_array_equal(counts, np.diag(np.full(D, 300)))


def test_ssfl_more_clients_than_classes() -> None:
    labels = unbalanced(3000)
    parts = run(SSFL(0.5), labels, 25, seed=0)
    counts = class_counts(labels, parts, D)
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=D))
    main = np.arange(25) % D
    assert (counts.argmax(axis=1) == main).all()


@pytest.mark.parametrize("r", [-0.1, 1.01, float("nan")])
def test_ssfl_invalid_r(r: float) -> None:
    with pytest.raises(ValueError, match="data.partitioner.r"):
        SSFL(r)


def test_ssfl_needs_enough_clients() -> None:
    with pytest.raises(ValueError, match="data.num_clients"):
        run(SSFL(0.4), balanced(100), 5, seed=0)


# ----------------------------------------------------------------------------- metric


def reference_r(counts: np.ndarray) -> float:
    """Direct double loop over client pairs (Definition 1, eq 1)."""
    p = counts / counts.sum(axis=1, keepdims=True)
    k = p.shape[0]
    total = 0.0
    for a, b in itertools.combinations(range(k), 2):
        total += np.abs(p[a] - p[b]).sum() / 2
    return 2.0 * total / (k * (k - 1))


def parts_from_counts(counts: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Labels and parts realising a (K, d) count matrix."""
    labels, parts, start = [], [], 0
    for row in counts:
        y = np.repeat(np.arange(row.size), row)
        labels.append(y)
        parts.append(np.arange(start, start + y.size))
        start += y.size
    return np.concatenate(labels), parts


def test_metric_hand_computed() -> None:
    counts = np.array([[2, 2, 0], [0, 4, 0], [1, 1, 2]])
    # P = [.5 .5 0], [0 1 0], [.25 .25 .5]; half-L1: 0.5, 0.5, 0.75 -> mean 7/12
    labels, parts = parts_from_counts(counts)
    assert non_iid_metric(labels, parts, 3) == pytest.approx(7 / 12)
    np.testing.assert_array_equal(class_counts(labels, parts, 3), counts)


@pytest.mark.parametrize("seed", range(5))
def test_metric_matches_double_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, d = int(rng.integers(2, 9)), int(rng.integers(2, 7))
    counts = rng.integers(0, 6, size=(k, d))
    counts[:, 0] += 1  # no empty client
    labels, parts = parts_from_counts(counts)
    assert non_iid_metric(labels, parts, d) == pytest.approx(reference_r(counts), abs=1e-12)


def test_metric_extremes() -> None:
    labels, parts = parts_from_counts(np.tile([3, 1, 2], (6, 1)))
    assert non_iid_metric(labels, parts, 3) == pytest.approx(0.0, abs=1e-12)
    labels, parts = parts_from_counts(np.diag(np.arange(1, D + 1)))
    assert non_iid_metric(labels, parts, D) == pytest.approx(1.0)
    assert non_iid_metric(np.array([0, 1, 1]), [np.array([0, 2])], 2) == 0.0


def test_metric_empty_client_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        non_iid_metric(np.array([0, 1]), [np.array([0, 1]), np.array([], dtype=np.int64)], 2)


def test_class_counts_shape() -> None:
    labels = np.array([0, 2, 2, 1, 0])
    counts = class_counts(labels, [np.array([0, 1]), np.array([2, 3, 4])], 4)
    np.testing.assert_array_equal(counts, [[1, 0, 1, 0], [1, 1, 1, 0]])
