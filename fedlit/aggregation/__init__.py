"""Aggregation rules as pure functions on state_dicts."""

from fedlit.aggregation.rules import (
    check_compatible,
    groupwise_average,
    mean,
    mean_with_server,
    split_into_groups,
    state_bytes,
    weight_diversity,
    weighted_average,
)

__all__ = [
    "check_compatible",
    "groupwise_average",
    "mean",
    "mean_with_server",
    "split_into_groups",
    "state_bytes",
    "weight_diversity",
    "weighted_average",
]
