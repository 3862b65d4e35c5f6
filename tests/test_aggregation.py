"""Aggregation rules against NumPy references on known tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlit.aggregation import (
    GroupwiseWithServer,
    Mean,
    MeanWithServer,
    WeightedMean,
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
    with pytest.raises(ValueError, match="weights"):  # a NaN weight has no positive sum
        weighted_average(_states(2), [1, float("nan")])
    with pytest.raises(ValueError, match=r"\[2, -1\]"):
        weighted_average(_states(2), [2, -1])


def test_state_bytes() -> None:
    state = {"a": torch.zeros(10), "b": torch.zeros(3, dtype=torch.float16), "n": torch.tensor(1)}
    assert state_bytes(state) == 10 * 4 + 3 * 2 + 8
    # a client's persistent state: nested, with values that are no tensors
    nested = {"mean": torch.zeros(5, 2), "count": 3, "parts": [torch.zeros(4, dtype=torch.int16)]}
    assert state_bytes(nested) == 5 * 2 * 4 + 4 * 2


def test_aggregators_against_numpy() -> None:
    """Within float32 accumulation's error (a few ulps of the inputs, about 1 here)."""
    uploads, server = _states(5), _states(1, seed=1)[0]
    counts = [10, 20, 30, 15, 25]
    w = np.stack([u["w"].numpy() for u in uploads])
    fedavg = WeightedMean()(uploads, counts)
    np.testing.assert_allclose(
        fedavg.state["w"], np.average(w, axis=0, weights=counts), rtol=1e-6, atol=1e-6
    )
    assert fedavg.group_states == [] and fedavg.groups == []
    np.testing.assert_allclose(Mean()(uploads, counts).state["w"], w.mean(0), rtol=1e-6, atol=1e-6)
    with_server = MeanWithServer()(uploads, counts, server)
    expected = np.concatenate([server["w"].numpy()[None], w]).mean(0)
    np.testing.assert_allclose(with_server.state["w"], expected, rtol=1e-6, atol=1e-6)
    grouped = GroupwiseWithServer(2)(uploads, counts, server)
    assert grouped.groups == [[0, 1], [2, 3, 4]]  # consecutive, near-equal
    g0 = np.concatenate([server["w"].numpy()[None], w[:2]]).mean(0)
    g1 = np.concatenate([server["w"].numpy()[None], w[2:]]).mean(0)
    np.testing.assert_allclose(grouped.group_states[0]["w"], g0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grouped.group_states[1]["w"], g1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grouped.state["w"], (g0 + g1) / 2, rtol=1e-6, atol=1e-6)
    assert len(GroupwiseWithServer(4)(uploads[:2], counts[:2], server).groups) == 2  # <= uploads


def test_aggregators_that_average_the_server_in_need_it() -> None:
    assert MeanWithServer.needs_server and GroupwiseWithServer.needs_server
    assert not (WeightedMean.needs_server or Mean.needs_server)
    with pytest.raises(ValueError, match="give server="):
        GroupwiseWithServer(2)(_states(3), [1, 1, 1])
    with pytest.raises(ValueError, match="num_groups must be positive"):
        GroupwiseWithServer(0)


@pytest.mark.parametrize("how", ["host_copy", "detached_copy"])
def test_an_upload_is_a_detached_copy_of_the_kept_keys(how: str) -> None:
    """An upload taken with ``host_copy`` (on the host) or ``detached_copy`` (where the
    module lies: here the host too) holds the module's values, shares no memory with it (the
    worker overwrites its network for the next client), needs no gradient and keeps only the
    keys asked for."""
    from torch import nn

    from fedlit.aggregation import payloads

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    module(torch.randn(4, 3))  # BatchNorm's running statistics move off their initial values
    taken = getattr(payloads, how)
    copy = taken(module, keep=lambda key: not key.endswith("num_batches_tracked"))
    state = module.state_dict()
    assert list(copy) == [k for k in state if not k.endswith("num_batches_tracked")]
    for key, value in copy.items():
        assert torch.equal(value, state[key]) and value.device.type == "cpu"
        assert not value.requires_grad and value.data_ptr() != state[key].data_ptr()
    with torch.no_grad():
        module[0].weight.add_(1.0)
    assert not torch.equal(copy["0.weight"], module[0].weight)
