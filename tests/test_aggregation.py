"""Aggregation rules against NumPy references on known tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.aggregation import (
    groupwise_average,
    mean,
    mean_with_server,
    split_into_groups,
    state_bytes,
    weighted_average,
)


def _states(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g),
            "bn.num_batches_tracked": torch.tensor(10 * (k + 1), dtype=torch.long),
        }
        for k in range(n)
    ]


def test_weighted_average_matches_numpy() -> None:
    states, weights = _states(3), [100, 300, 600]
    out = weighted_average(states, weights)
    for key in ("w", "b"):
        ref = np.average(np.stack([s[key].numpy() for s in states]), axis=0, weights=weights)
        np.testing.assert_allclose(out[key].numpy(), ref, rtol=1e-6, atol=1e-7)
        assert out[key].dtype == torch.float32


def test_integer_buffers_are_averaged_and_rounded() -> None:
    out = weighted_average(_states(3), [100, 300, 600])
    # counters 10, 20, 30 with weights .1 .3 .6 -> 25.0
    assert out["bn.num_batches_tracked"].dtype == torch.long
    assert out["bn.num_batches_tracked"].item() == 25
    out = mean(_states(2))  # 15 -> rounds to even (15.0 exactly here)
    assert out["bn.num_batches_tracked"].item() == 15


def test_mean_is_unweighted() -> None:
    states = _states(4)
    ref = np.mean(np.stack([s["w"].numpy() for s in states]), axis=0)
    np.testing.assert_allclose(mean(states)["w"].numpy(), ref, rtol=1e-6, atol=1e-7)


def test_inputs_not_modified() -> None:
    states = _states(2)
    before = [{k: v.clone() for k, v in s.items()} for s in states]
    weighted_average(states, [1, 3])
    for s, b in zip(states, before, strict=True):
        for k in s:
            assert torch.equal(s[k], b[k])


def test_mean_with_server_counts_server_as_one_more() -> None:
    server = {"w": torch.zeros(2)}
    clients = [{"w": torch.tensor([3.0, 6.0])}, {"w": torch.tensor([6.0, 3.0])}]
    out = mean_with_server(server, clients)  # paper 004 eq 5: (0 + 3 + 6) / 3
    torch.testing.assert_close(out["w"], torch.tensor([3.0, 3.0]))


def test_groupwise_average_eq7() -> None:
    server = {"w": torch.tensor([0.0])}
    clients = [{"w": torch.tensor([float(v)])} for v in (3, 6, 9, 12, 15)]
    groups = [[0, 1], [2, 3, 4]]
    global_, per_group = groupwise_average(server, clients, groups)
    # group 1: (0+3+6)/3 = 3; group 2: (0+9+12+15)/4 = 9; global = (3+9)/2 = 6
    assert [g["w"].item() for g in per_group] == [3.0, 9.0]
    assert global_["w"].item() == 6.0


def test_groupwise_rejects_bad_groups() -> None:
    server, clients = {"w": torch.zeros(1)}, [{"w": torch.ones(1)}] * 3
    with pytest.raises(ValueError, match="split clients"):
        groupwise_average(server, clients, [[0, 1]])


def test_split_into_groups() -> None:
    assert split_into_groups(5, 2) == [[0, 1], [2, 3, 4]]
    assert split_into_groups(4, 4) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError):
        split_into_groups(2, 3)


def test_mismatched_keys_name_the_key() -> None:
    a = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(ValueError, match="'b'"):
        weighted_average([a, {"w": torch.zeros(2)}], [1, 1])
    with pytest.raises(ValueError, match="'extra'"):
        weighted_average([a, {**a, "extra": torch.zeros(1)}], [1, 1])
    with pytest.raises(ValueError, match="'w'.*shape"):
        weighted_average([a, {"w": torch.zeros(3), "b": torch.zeros(1)}], [1, 1])


def test_bad_weights() -> None:
    with pytest.raises(ValueError, match="weights"):
        weighted_average(_states(2), [0, 0])
    with pytest.raises(ValueError, match="2 states"):
        weighted_average(_states(2), [1])


def test_state_bytes() -> None:
    state = {"a": torch.zeros(10), "b": torch.zeros(3, dtype=torch.float16), "n": torch.tensor(1)}
    assert state_bytes(state) == 10 * 4 + 3 * 2 + 8
