"""Aggregators: small objects a method chooses, each one of the pure rules of
:mod:`fedlit.aggregation.rules` with what it needs (weights, the server's model, groups).

An aggregator maps the round's uploads (their order is the round's client order), their example
counts n_k and, for the rules that average the server's model in, the server's state, to an
:class:`Aggregated`: the new global state and, for group-wise rules, each group's own average.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from torch import Tensor

from fedlit.aggregation.rules import (
    State,
    groupwise_average,
    mean,
    mean_with_server,
    split_into_groups,
    statistic_weighted_average,
    weighted_average,
)


@dataclass(frozen=True)
class Aggregated:
    """An aggregator's result.

    Attributes:
        state: the new global state.
        group_states: each group's average (group-wise rules; empty otherwise).
        groups: the positions in the round's uploads of each group's members.
    """

    state: dict[str, Tensor]
    group_states: list[dict[str, Tensor]] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)


class Aggregator(Protocol):
    #: Whether the rule averages the server's own model in (``server`` must be given).
    needs_server: ClassVar[bool]

    def __call__(
        self, uploads: Sequence[State], num_examples: Sequence[int], server: State | None = None
    ) -> Aggregated: ...


def _server(server: State | None, rule: str) -> State:
    if server is None:
        raise ValueError(f"{rule} averages the server's model in: give server=")
    return server


@dataclass(frozen=True)
class WeightedMean:
    """FedAvg: sum_k n_k w_k / sum_k n_k."""

    needs_server: ClassVar[bool] = False

    def __call__(
        self, uploads: Sequence[State], num_examples: Sequence[int], server: State | None = None
    ) -> Aggregated:
        return Aggregated(weighted_average(uploads, num_examples))


@dataclass(frozen=True)
class StatisticWeighted:
    """sum_k s_k w_k / sum_k s_k: the uploads weighted by a statistic s_k of each client
    (:func:`~fedlit.aggregation.rules.statistic_weighted_average`), given by the method as
    ``statistics`` ((FL)^2's learning status, 1 - tau_k), not by the example counts."""

    needs_server: ClassVar[bool] = False

    def __call__(
        self,
        uploads: Sequence[State],
        num_examples: Sequence[int],
        server: State | None = None,
        *,
        statistics: Sequence[float] | None = None,
    ) -> Aggregated:
        if statistics is None:
            raise ValueError("StatisticWeighted weights the uploads by a statistic: statistics=")
        return Aggregated(statistic_weighted_average(uploads, statistics))


@dataclass(frozen=True)
class Mean:
    """The plain mean of the uploads (paper 001 III-B, paper 002 4.1.1, paper 003's
    algorithms)."""

    needs_server: ClassVar[bool] = False

    def __call__(
        self, uploads: Sequence[State], num_examples: Sequence[int], server: State | None = None
    ) -> Aggregated:
        return Aggregated(mean(uploads))


@dataclass(frozen=True)
class MeanWithServer:
    """(w_s + sum_k w_k) / (C + 1): the uploads and the server's model, equally (paper 004
    eqs 4-5)."""

    needs_server: ClassVar[bool] = True

    def __call__(
        self, uploads: Sequence[State], num_examples: Sequence[int], server: State | None = None
    ) -> Aggregated:
        return Aggregated(mean_with_server(_server(server, "MeanWithServer"), uploads))


@dataclass(frozen=True)
class GroupwiseWithServer:
    """Group-wise averaging with the server's model (paper 004 eq 7; paper 000 Algorithm 2):
    the uploads in ``num_groups`` groups of consecutive positions (fewer when there are fewer
    uploads), w_avg,i = (w_s + sum_{k in G_i} w_k) / (|G_i| + 1), w_avg = mean_i w_avg,i."""

    num_groups: int = 2
    needs_server: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.num_groups < 1:
            raise ValueError(f"num_groups must be positive, got {self.num_groups}")

    def __call__(
        self, uploads: Sequence[State], num_examples: Sequence[int], server: State | None = None
    ) -> Aggregated:
        groups = split_into_groups(len(uploads), min(self.num_groups, len(uploads)))
        average, group_states = groupwise_average(
            _server(server, "GroupwiseWithServer"), uploads, groups
        )
        return Aggregated(average, list(group_states), [list(g) for g in groups])
