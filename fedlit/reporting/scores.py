"""A run's scores (its final, selected and last-``k`` values of a metric, the round it reaches a
target, the bytes it sent) and the statistics over seeds that the tables give (mean ± std,
the 95% t-interval)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from fedlit.reporting.runs import RunRecord
from fedlit.run_layout import BYTES_KEYS, VAL_ACC


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std with ddof=1) of the finite values; NaN where undefined."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    mean = float(np.mean(finite)) if finite.size else math.nan
    std = float(np.std(finite, ddof=1)) if finite.size >= 2 else math.nan
    return mean, std


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Student's t quantile of a two-sided ``confidence`` interval (0.95: the 0.975 quantile)
    with ``df`` degrees of freedom (NaN for ``df < 1``)."""
    if df < 1:
        return math.nan
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def ci95(values: Sequence[float], confidence: float = 0.95) -> float:
    """The half-width of the two-sided t-interval of the mean of ``values`` (95%, or
    ``confidence``); NaN for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return math.nan
    return t_quantile(n - 1, confidence) * float(np.std(values, ddof=1)) / math.sqrt(n)


def first_round_at(run: RunRecord, metric: str, target: float) -> int | None:
    """The first round where ``metric`` >= ``target``, or None if it never gets there."""
    rounds, values = run.series(metric)
    hits = np.flatnonzero(values >= target)
    return int(rounds[hits[0]]) if hits.size else None


def selected_value(run: RunRecord, metric: str) -> float:
    """``metric`` at the round of the run's highest ``val/acc`` (the first on a tie; NaN
    without ``val/acc`` or without ``metric`` in that round)."""
    rows = [row for row in run.history if VAL_ACC in row]
    if not rows:
        return math.nan
    best = max(range(len(rows)), key=lambda i: (rows[i][VAL_ACC], -i))
    return rows[best].get(metric, math.nan)


def bytes_sent(run: RunRecord) -> float:
    """Bytes sent down plus up, summed over every logged round."""
    return float(sum(row.get(key, 0.0) for row in run.history for key in BYTES_KEYS))


def final_value(run: RunRecord, metric: str) -> float:
    """The run's last logged value of ``metric`` (NaN if it never logged it)."""
    _, values = run.series(metric)
    return float(values[-1]) if values.size else math.nan


def score(run: RunRecord, metric: str, last_k: int) -> float:
    """The mean of the run's last ``last_k`` logged values of ``metric`` (fewer if it logged
    fewer; NaN if none)."""
    _, values = run.series(metric)
    return float(np.mean(values[-last_k:])) if values.size else math.nan


def last_k_warning(
    runs: Sequence[RunRecord], last_k: int, key: str = "last_k", metric: str = "test/acc"
) -> str | None:
    """A line saying which runs logged ``metric`` in fewer than ``last_k`` rounds but in some
    (their score is then the mean of all those rounds), or None. A run that logged none has
    no score to average (``fedlit report`` warns of it on its own)."""
    short = [(run, run.series(metric)[1].size) for run in runs]
    short = [(run, n) for run, n in short if 0 < n < last_k]
    if not short:
        return None
    run, n = short[0]
    others = f" and {len(short) - 1} other run(s)" if len(short) > 1 else ""
    return (
        f"{key}={last_k} exceeds the {n} round(s) in which {run.run_dir}{others} logged "
        f"{metric}; such a run's score is the mean of all its rounds"
    )
