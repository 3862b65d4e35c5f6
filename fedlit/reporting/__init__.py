"""Reporting: run directories read back, result tables over seeds, and figures."""

from fedlit.reporting.confounds import differing_settings
from fedlit.reporting.plots import DIAGNOSTICS, plot_curves, plot_diagnostics, plot_partition
from fedlit.reporting.runs import RunRecord, find_runs, load_run
from fedlit.reporting.table import (
    FINAL_EVAL_KEYS,
    ConfigGroup,
    ResultRow,
    config_groups,
    last_k_warning,
    split_settings,
    summarize,
    to_markdown,
    write_csv,
)

__all__ = [
    "DIAGNOSTICS",
    "FINAL_EVAL_KEYS",
    "ConfigGroup",
    "ResultRow",
    "RunRecord",
    "config_groups",
    "differing_settings",
    "find_runs",
    "last_k_warning",
    "load_run",
    "plot_curves",
    "plot_diagnostics",
    "plot_partition",
    "split_settings",
    "summarize",
    "to_markdown",
    "write_csv",
]
