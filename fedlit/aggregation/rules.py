"""Aggregation rules: pure functions on state_dicts (name -> tensor). No Lightning here.

Conventions shared by every rule:

* All states must have the same keys, shapes and dtypes; a mismatch raises ValueError naming
  the key (and which state differs).
* Averages of floating-point tensors are accumulated in their own dtype, float32 at least
  (bf16 and fp16 tensors in float32), by torch's multi-tensor ops, and cast back: a few ops a
  state, on the device the states lie on, no float64 copy of every tensor.
* Integer tensors (BatchNorm's ``num_batches_tracked``) are averaged in float64 and rounded to
  the nearest integer, so an averaged counter stays a count of the same order.
* The inputs are never modified; the result holds new tensors on the first state's device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves

State = Mapping[str, Tensor]


def check_compatible(states: Sequence[State]) -> None:
    """Raise ValueError naming the first key on which ``states`` disagree."""
    if not states:
        raise ValueError("nothing to aggregate: no states given")
    ref = states[0]
    for i, state in enumerate(states[1:], start=1):
        missing = [k for k in ref if k not in state]
        extra = [k for k in state if k not in ref]
        if missing:
            raise ValueError(f"state {i} lacks key {missing[0]!r} that state 0 has")
        if extra:
            raise ValueError(f"state {i} has key {extra[0]!r} that state 0 lacks")
        for k, v in ref.items():
            if state[k].shape != v.shape:
                raise ValueError(
                    f"key {k!r}: state {i} has shape {tuple(state[k].shape)}, "
                    f"state 0 has {tuple(v.shape)}"
                )
            if state[k].dtype != v.dtype:
                raise ValueError(
                    f"key {k!r}: state {i} has dtype {state[k].dtype}, state 0 {v.dtype}"
                )


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> dict[str, Tensor]:
    """sum_k w_k * state_k / sum_k w_k, key by key (FedAvg with w_k = n_k, McMahan et al. 2017)."""
    check_compatible(states)
    if len(weights) != len(states):
        raise ValueError(f"{len(weights)} weights for {len(states)} states")
    floats = [float(x) for x in weights]
    if any(x < 0 for x in floats) or not sum(floats) > 0:  # checked on the host: no tensor read
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    total = torch.tensor(floats, dtype=torch.float64)
    w = (total / total.sum()).tolist()
    ref = states[0]
    groups: dict[torch.dtype, list[str]] = {}  # the keys accumulated in each dtype
    for key, value in ref.items():
        groups.setdefault(_accumulated_in(value), []).append(key)
    out: dict[str, Tensor] = {}
    with torch.no_grad():  # the inputs' autograd history, if any, is not the average's
        for dtype, keys in groups.items():
            sums = torch._foreach_mul(_column(ref, ref, keys, dtype), w[0])  # new: inputs are kept
            for state, weight in zip(states[1:], w[1:], strict=True):
                torch._foreach_add_(sums, _column(state, ref, keys, dtype), alpha=weight)
            for key, value in zip(keys, sums, strict=True):
                if not (ref[key].is_floating_point() or ref[key].is_complex()):
                    value = value.round()
                out[key] = value.to(ref[key].dtype)
    return {key: out[key] for key in ref}


def _column(state: State, ref: State, keys: Sequence[str], dtype: torch.dtype) -> list[Tensor]:
    """``state``'s tensors of ``keys`` in ``dtype`` on ``ref``'s devices (as they are where
    they are so already)."""
    return [state[k].to(ref[k].device, dtype) for k in keys]


def _accumulated_in(value: Tensor) -> torch.dtype:
    """The dtype an average of ``value``'s key is accumulated in: its own for float32, float64
    and complex tensors, float32 for lower-precision floats, float64 for integers."""
    if value.is_complex() or value.dtype in (torch.float32, torch.float64):
        return value.dtype
    return torch.float32 if value.is_floating_point() else torch.float64


def statistic_weighted_average(
    states: Sequence[State], statistics: Sequence[float]
) -> dict[str, Tensor]:
    """sum_k s_k * state_k / sum_k s_k, s_k a statistic of client k (a learning status, say:
    (FL)^2's 1 - tau_k), not its example count. The statistics must be finite and
    non-negative; where they sum to 0 (no client gets weight), the plain :func:`mean`."""
    values = [float(x) for x in statistics]
    if len(values) != len(states):
        raise ValueError(f"{len(values)} statistics for {len(states)} states")
    if any(not math.isfinite(x) or x < 0 for x in values):
        raise ValueError(f"statistics must be finite and >= 0, got {values}")
    if sum(values) == 0:
        return mean(states)
    return weighted_average(states, values)


def mean(states: Sequence[State]) -> dict[str, Tensor]:
    """The plain (unweighted) mean of ``states``."""
    return weighted_average(states, [1.0] * len(states))


def mean_with_server(server: State, clients: Sequence[State]) -> dict[str, Tensor]:
    """(w_s + sum_k w_k) / (C + 1): the server's model counts as one more client.

    Paper 004, eqs (4)-(5).
    """
    return mean([server, *clients])


def groupwise_average(
    server: State, clients: Sequence[State], groups: Sequence[Sequence[int]]
) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
    """Grouping-based model averaging, paper 004 eq (7).

    w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1) for each group G_i (indices into
    ``clients``), and w_avg = sum_i w_avg,i / S. Returns (w_avg, [w_avg,1 .. w_avg,S]): w_avg is
    what the server trains on, w_avg,i what group G_i's clients start from next time.
    """
    flat = [k for g in groups for k in g]
    if sorted(flat) != list(range(len(clients))):
        raise ValueError(
            f"groups {list(map(list, groups))} must split clients 0..{len(clients) - 1}"
        )
    if any(len(g) == 0 for g in groups):
        raise ValueError("every group needs at least one client")
    group_avgs = [mean_with_server(server, [clients[k] for k in g]) for g in groups]
    return mean(group_avgs), group_avgs


def split_into_groups(num_clients: int, num_groups: int) -> list[list[int]]:
    """Consecutive, near-equal groups: 5 clients in 2 groups -> [[0, 1], [2, 3, 4]]."""
    if not 1 <= num_groups <= num_clients:
        raise ValueError(f"num_groups must be in [1, {num_clients}], got {num_groups}")
    bounds = [round(i * num_clients / num_groups) for i in range(num_groups + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(num_groups)]


def weight_diversity(starts: Sequence[State], finals: Sequence[State]) -> float:
    """Weight (gradient) diversity of one round's client updates, paper 004 eq (8).

    With Delta_k = w_k - s_k (what client k's training changed: its final weights minus the
    weights it started from, over the floating-point tensors ``finals`` share with ``starts``),
    returns sum_k ||Delta_k||^2 / ||sum_k Delta_k||^2 (Yin et al. 2018, the paper's reference
    [38]): 1 / C when all clients moved alike, 1 when their moves were orthogonal, large when
    they cancel out. NaN when the updates sum to zero. The differences and each tensor's norm
    are computed in the tensors' dtype by multi-tensor ops, the squared norms summed in
    float64.
    """
    if len(starts) != len(finals) or not finals:
        raise ValueError(f"{len(starts)} start states for {len(finals)} final states")
    keys = [k for k, v in finals[0].items() if v.is_floating_point() and k in starts[0]]
    if not keys:
        return float("nan")
    with torch.no_grad():
        delta = [torch.empty_like(finals[0][k]) for k in keys]  # one buffer for every client
        total = [torch.zeros_like(d) for d in delta]
        befores: dict[int, list[Tensor]] = {}  # a start state many clients share: cast once
        norms = []
        for start, final in zip(starts, finals, strict=True):
            before = befores.get(id(start))
            if before is None:
                before = [start[k].to(d.device, d.dtype) for k, d in zip(keys, delta, strict=True)]
                befores[id(start)] = before
            for d, key, b in zip(delta, keys, before, strict=True):
                torch.sub(final[key].to(d.device), b, out=d)
            norms.append(torch.stack(torch._foreach_norm(delta)))  # each tensor's ||Delta_k||
            torch._foreach_add_(total, delta)
        squares = torch.stack(norms).double().pow(2).sum()
        summed = torch.stack(torch._foreach_norm(total)).double().pow(2).sum()
        # one host read for the whole round, not one a client
        numerator, denominator = torch.stack([squares, summed.to(squares.device)]).tolist()
    return numerator / denominator if denominator > 0 else float("nan")


def state_bytes(state: Any) -> int:
    """Bytes a state occupies on the wire or in memory, uncompressed (numel * element size,
    summed): a state dict, a tensor, or nested dicts, lists and tuples of them (a client's
    persistent state); its other values count nothing."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(state) if torch.is_tensor(t))
