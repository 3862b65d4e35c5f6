"""Comparisons: recipes x settings x seeds run one after another, and their report."""

from fedlit.comparison.runner import (
    RUN_FILE,
    Comparison,
    PlannedRun,
    SourceRun,
    WandbSettings,
    execute,
    plan,
    run_comparison,
    run_state,
)

__all__ = [
    "RUN_FILE",
    "Comparison",
    "PlannedRun",
    "SourceRun",
    "WandbSettings",
    "execute",
    "plan",
    "run_comparison",
    "run_state",
]
