"""Aggregation rules as pure functions on state_dicts, and the aggregators methods choose."""

from fedlit.aggregation.aggregators import (
    Aggregated,
    Aggregator,
    GroupwiseWithServer,
    Mean,
    MeanWithServer,
    StatisticWeighted,
    WeightedMean,
)
from fedlit.aggregation.momentum import ServerMomentum, momentum_step
from fedlit.aggregation.rules import (
    check_compatible,
    groupwise_average,
    mean,
    mean_with_server,
    split_into_groups,
    state_bytes,
    statistic_weighted_average,
    weight_diversity,
    weighted_average,
)

__all__ = [
    "Aggregated",
    "Aggregator",
    "GroupwiseWithServer",
    "Mean",
    "MeanWithServer",
    "StatisticWeighted",
    "WeightedMean",
    "check_compatible",
    "groupwise_average",
    "mean",
    "mean_with_server",
    "split_into_groups",
    "state_bytes",
    "statistic_weighted_average",
    "weight_diversity",
    "weighted_average",
    "ServerMomentum",
    "momentum_step",
]
