"""Tests for fedlit.data.sampling: sample_clients and visit_number."""

from __future__ import annotations

import numpy as np
import pytest

from fedlit.data.sampling import sample_clients, visit_number


def test_same_seed_and_round_same_clients() -> None:
    a = sample_clients(100, 5, seed=3, round_idx=7)
    b = sample_clients(100, 5, seed=3, round_idx=7)
    np.testing.assert_array_equal(a, b)


def test_independent_of_global_rng_and_history() -> None:
    np.random.seed(0)
    a = sample_clients(50, 10, seed=1, round_idx=4)
    np.random.seed(99)
    for r in range(4):
        sample_clients(50, 10, seed=1, round_idx=r)
    b = sample_clients(50, 10, seed=1, round_idx=4)
    np.testing.assert_array_equal(a, b)


def test_rounds_and_seeds_differ() -> None:
    draws = [tuple(sample_clients(100, 5, seed=0, round_idx=r)) for r in range(10)]
    assert len(set(draws)) == 10
    other = [tuple(sample_clients(100, 5, seed=1, round_idx=r)) for r in range(10)]
    assert draws != other


@pytest.mark.parametrize("k,c", [(1, 1), (10, 10), (100, 5), (37, 12)])
def test_shape_range_unique_sorted(k: int, c: int) -> None:
    for r in range(5):
        ids = sample_clients(k, c, seed=11, round_idx=r)
        assert ids.dtype == np.int64
        assert ids.shape == (c,)
        assert np.unique(ids).size == c
        assert ids.min() >= 0 and ids.max() < k
        assert (np.diff(ids) > 0).all()


def test_roughly_uniform() -> None:
    hits = np.zeros(20)
    for r in range(2000):
        hits[sample_clients(20, 5, seed=0, round_idx=r)] += 1
    # each client expected 500 times; binomial sd ~ 19
    assert np.abs(hits - 500).max() < 100


@pytest.mark.parametrize("c", [0, -1, 11])
def test_invalid_per_round(c: int) -> None:
    with pytest.raises(ValueError, match="federation.clients_per_round") as err:
        sample_clients(10, c, seed=0, round_idx=0)
    assert "data.num_clients" in str(err.value)


def test_invalid_num_clients() -> None:
    with pytest.raises(ValueError, match="data.num_clients"):
        sample_clients(0, 1, seed=0, round_idx=0)


@pytest.mark.parametrize(("k", "c", "seed"), [(10, 3, 0), (7, 1, 5), (20, 8, 2)])
def test_visit_number_counts_selections(k: int, c: int, seed: int) -> None:
    seen = np.zeros(k, dtype=int)
    assert [visit_number(i, k, c, seed, 0) for i in range(k)] == [0] * k
    for r in range(1, 31):
        seen[sample_clients(k, c, seed, r)] += 1
        assert [visit_number(i, k, c, seed, r) for i in range(k)] == seen.tolist()
    assert seen.max() > 1  # some client was visited more than once


def test_visit_number_when_every_client_takes_part() -> None:
    for r in range(6):
        assert visit_number(3, 4, 4, seed=1, round_idx=r) == r


@pytest.mark.parametrize("client_id", [-1, 10])
def test_visit_number_rejects_unknown_client(client_id: int) -> None:
    with pytest.raises(ValueError, match="client_id"):
        visit_number(client_id, 10, 2, seed=0, round_idx=3)
