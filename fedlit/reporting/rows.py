"""Result rows: runs grouped by (setting, method) and config group into mean ± std over seeds,
with the paired difference from a baseline."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fedlit.reporting.confounds import (
    Contribution,
    ServerBudget,
    contribution,
    row_flags,
    server_budget,
)
from fedlit.reporting.groups import config_groups, values_agree
from fedlit.reporting.runs import RunRecord
from fedlit.reporting.scores import (
    bytes_sent,
    ci95,
    final_value,
    first_round_at,
    mean_std,
    score,
    selected_value,
)
from fedlit.run_layout import FINAL_EVAL_KEYS


@dataclass(frozen=True)
class ResultRow:
    """One method in one setting, aggregated over its seeds.

    Attributes:
        method, setting: the group: the method, and the setting with the values that tell
            its config group apart where the setting's runs differ (:func:`config_groups`).
        seeds: the runs' seeds, in run order.
        rounds: the rounds each run ran (its last logged round), in run order.
        final_mean, final_std: the metric at each run's last logged value (the last round for a
            finished run); std is the sample std (ddof=1), NaN with one seed.
        selected_mean, selected_std: each run's metric at the round its validation accuracy
            (``val/acc``, the server's validation split) was highest, the first such round
            on a tie: the model selection a run may make without the test set; NaN for runs
            that logged no ``val/acc``.
        rounds_to_target: mean over the seeds that reached ``target`` of the first round with
            metric >= target; NaN if none reached it or there is no target.
        reached: how many seeds reached the target (0 without a target).
        bytes_total: mean over seeds of the sum over rounds of comm/bytes_down + comm/bytes_up.
        finished: how many of the runs are finished.
        delta_mean, delta_std: the paired difference from the baseline method: per seed, this
            run's score (the mean of its last ``last_k`` logged values) minus the baseline's run
            of the same setting, config group and seed (the same labeled set and partition);
            mean and sample std over those seeds; NaN without a baseline.
        delta_seeds: how many seeds the difference is over (0 without a baseline).
        delta_ci95: the half-width of the difference's two-sided 95% confidence interval,
            t_{0.975, n-1} * std / sqrt(n) over the n paired seeds (NaN for n < 2).
        last_k: how many last logged values each run's score averages.
        score_mean, score_std: the score (the mean of each run's last ``last_k`` values) over
            seeds; with ``last_k=1`` the final value.
        finetune_mean, finetune_std, linear_mean, linear_std: ``eval/finetune_acc`` and
            ``eval/linear_acc`` (the driver's ``federation.final_eval`` of the global encoder
            after the last round) over seeds; NaN where not logged.
        marks: what the table writes beside the method (``oracle``), from its runs.
        server_epochs, server_stages, server_steps, bootstrap_epochs: the server's training
            over a run (:class:`~fedlit.reporting.confounds.ServerBudget`: its epochs,
            bootstrap's included, the times it trained in the rounds, its optimiser steps,
            its bootstrap's epochs), mean over seeds.
        warm_start: the runs' warm-start sources ("; "-joined; "" for none).
        client_rounds, silent_rounds: the rounds, over all its runs, that logged
            ``client/contributed``, and those in which no client's unlabeled loss was active.
        client_activity: the clients' confident fraction (``client/mask_rate``, FedSEAL's
            ``pseudo/pos_frac``), mean over rounds and seeds; NaN where not logged.
        flags: what else could explain the row's result
            (:func:`~fedlit.reporting.confounds.row_flags`): clients that contributed
            nothing, a server budget unlike the baseline's (without a baseline, unlike
            another row's of its setting).
    """

    method: str
    setting: str
    seeds: tuple[int, ...]
    rounds: tuple[int, ...]
    final_mean: float
    final_std: float
    selected_mean: float
    selected_std: float
    rounds_to_target: float
    reached: int
    bytes_total: float
    finished: int
    delta_mean: float = math.nan
    delta_std: float = math.nan
    delta_seeds: int = 0
    delta_ci95: float = math.nan
    last_k: int = 1
    score_mean: float = math.nan
    score_std: float = math.nan
    finetune_mean: float = math.nan
    finetune_std: float = math.nan
    linear_mean: float = math.nan
    linear_std: float = math.nan
    marks: tuple[str, ...] = ()
    server_epochs: float = math.nan
    server_stages: float = math.nan
    server_steps: float = math.nan
    bootstrap_epochs: float = math.nan
    warm_start: str = ""
    client_rounds: int = 0
    silent_rounds: int = 0
    client_activity: float = math.nan
    flags: tuple[str, ...] = ()


def _summarize_group(
    runs: Sequence[RunRecord],
    target: float | None,
    metric: str,
    baseline: Mapping[int, float] | None = None,
    last_k: int = 1,
    setting: str | None = None,
    *,
    budgets: Sequence[ServerBudget],
    clients: Sequence[Contribution],
) -> ResultRow:
    """One ResultRow from the runs of one row (:func:`summarize`); ``baseline``: seed -> the
    baseline method's score in the same setting; ``setting``: the row's label (None: the
    runs' setting); ``budgets``, ``clients``: the runs' server budgets and contributions
    (:func:`summarize` reads them once: the flags compare them too)."""
    finals, scores, selected, hits, deltas = [], [], [], [], []
    for run in runs:
        finals.append(final_value(run, metric))
        scores.append(score(run, metric, last_k))
        selected.append(selected_value(run, metric))
        if target is not None:
            hit = first_round_at(run, metric, target)
            if hit is not None:
                hits.append(hit)
        if baseline is not None and run.seed in baseline:
            delta = scores[-1] - baseline[run.seed]
            if math.isfinite(delta):
                deltas.append(delta)
    final_mean, final_std = mean_std(finals)
    selected_mean, selected_std = mean_std(selected)
    delta_mean, delta_std = mean_std(deltas)
    score_mean, score_std = mean_std(scores)
    finetune = mean_std([final_value(run, FINAL_EVAL_KEYS["finetune"]) for run in runs])
    linear = mean_std([final_value(run, FINAL_EVAL_KEYS["linear"]) for run in runs])
    return ResultRow(
        method=runs[0].method,
        marks=runs[0].marks,
        setting=runs[0].setting if setting is None else setting,
        seeds=tuple(run.seed for run in runs),
        rounds=tuple(run.last_round for run in runs),
        final_mean=final_mean,
        final_std=final_std,
        selected_mean=selected_mean,
        selected_std=selected_std,
        rounds_to_target=float(np.mean(hits)) if hits else math.nan,
        reached=len(hits),
        bytes_total=float(np.mean([bytes_sent(run) for run in runs])),
        finished=sum(run.finished for run in runs),
        delta_mean=delta_mean,
        delta_std=delta_std,
        delta_seeds=len(deltas),
        delta_ci95=ci95(deltas),
        last_k=last_k,
        score_mean=score_mean,
        score_std=score_std,
        finetune_mean=finetune[0],
        finetune_std=finetune[1],
        linear_mean=linear[0],
        linear_std=linear[1],
        server_epochs=float(np.mean([b.epochs for b in budgets])),
        server_stages=float(np.mean([b.stages for b in budgets])),
        server_steps=float(np.mean([b.steps for b in budgets])),
        bootstrap_epochs=float(np.mean([b.bootstrap_epochs for b in budgets])),
        warm_start="; ".join(sorted({b.warm_start for b in budgets} - {""})),
        client_rounds=sum(c.rounds for c in clients),
        silent_rounds=sum(c.silent for c in clients),
        client_activity=mean_std([c.activity for c in clients])[0],
    )


def summarize(
    runs: Sequence[RunRecord],
    target: float | None = None,
    metric: str = "test/acc",
    baseline: str | None = None,
    last_k: int = 1,
) -> list[ResultRow]:
    """One ResultRow per (setting, method) and config group, in first-appearance order of
    ``runs``.

    Runs of one (setting, method) are pooled as seeds where their flat configs agree in
    everything but the seed and what is no setting
    (:data:`~fedlit.run_layout.NOT_SETTING_KEYS`); runs that differ (another data set,
    network, ...) are rows of their own, whose setting is labelled by the values they differ
    in (:func:`config_groups`).

    A run's score is the mean of its last ``last_k`` logged values of ``metric`` (its final
    value for 1): less of one round's noise than the last value alone.

    ``target`` is in the metric's units (a fraction for test/acc). A run that never logs the
    metric counts as a seed but not towards the means. ``baseline`` names the method every
    row is compared with, seed by seed (``delta_*``): a row's run against the baseline's run
    of the same setting and seed whose splitting values agree with the row's on every key
    both have (a seed where none or several do is not paired). Raises ValueError naming both
    run directories if two runs of one row share a seed, as they would be counted twice,
    and naming ``baseline`` if no run is of that method.
    """
    rows: dict[tuple[str, str, str], list[RunRecord]] = {}
    where: dict[tuple[str, str, str], dict[str, str]] = {}
    seen: dict[tuple[str, str, str, int], RunRecord] = {}
    for run, group in zip(runs, config_groups(runs), strict=True):
        key = (run.setting, run.method, group.label)
        ident = (*key, run.seed)
        if ident in seen:
            raise ValueError(
                f"runs {seen[ident].run_dir} and {run.run_dir} are both "
                f"setting={run.setting!r}, method={run.method!r}, seed={run.seed}, and their "
                "configs agree: the seed would be counted twice"
            )
        seen[ident] = run
        rows.setdefault(key, []).append(run)
        where[key] = dict(group.values)
    if isinstance(last_k, bool) or not isinstance(last_k, int) or last_k < 1:
        raise ValueError(f"last_k must be a positive integer, got {last_k!r}")
    if baseline is not None and baseline not in {method for _, method, _ in rows}:
        methods = sorted({method for _, method, _ in rows})
        raise ValueError(f"baseline: no run of method {baseline!r} (methods: {methods})")

    def reference(setting: str, values: Mapping[str, str]) -> dict[int, float] | None:
        """Seed -> the score of the baseline's one run that pairs with a row's of that seed."""
        if baseline is None:
            return None
        by_seed: dict[int, list[RunRecord]] = {}
        for key, group in rows.items():
            if key[:2] == (setting, baseline) and values_agree(values, where[key]):
                for run in group:
                    by_seed.setdefault(run.seed, []).append(run)
        return {
            seed: score(found[0], metric, last_k)
            for seed, found in by_seed.items()
            if len(found) == 1
        }

    budgets = {key: [server_budget(run) for run in group] for key, group in rows.items()}
    clients = {key: [contribution(run) for run in group] for key, group in rows.items()}

    def compared(key: tuple[str, str, str]) -> list[list[ServerBudget]]:
        """The budgets a row's server budget is set against: the baseline's rows it pairs
        with (none for the baseline's own); without a baseline, the other rows of its table."""
        if baseline is None:
            return [budgets[other] for other in rows if other[2] == key[2] and other != key]
        if key[1] == baseline:
            return []
        return [
            budgets[other]
            for other in rows
            if other[:2] == (key[0], baseline) and values_agree(where[key], where[other])
        ]

    return [
        replace(
            _summarize_group(
                group,
                target,
                metric,
                reference(key[0], where[key]),
                last_k,
                key[2],
                budgets=budgets[key],
                clients=clients[key],
            ),
            flags=row_flags(clients[key], budgets[key], compared(key)),
        )
        for key, group in rows.items()
    ]
