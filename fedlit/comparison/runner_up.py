"""A tuned comparison's selection noise measured on the test set (``tune.runner_up``): each
study's runner-up settings run on the scoring seeds, beside the chosen settings' runs, and the
paired difference of their scores. The resampled *flip* says how often the validation set could
have chosen the runner-up; this says what that choice would have changed on the test set."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedlit.comparison.plan import ROOT_DIR_ARG, PlannedRun
from fedlit.comparison.spec import Comparison
from fedlit.comparison.studies import LOGGER_ARG, StudyResult, with_settings
from fedlit.comparison.tune import overrides
from fedlit.reporting import load_run
from fedlit.reporting.scores import ci95, score
from fedlit.run_layout import CHECKPOINT, TEST_ACC

#: The runner-up's runs' folder and name: the recipe's, then this.
SUFFIX = "_runner_up"


@dataclass(frozen=True)
class RunnerUpRun(PlannedRun):
    """A run of a study's runner-up settings, named (``run.json``'s method) by its folder, so
    that no report takes it for a seed of the chosen settings."""

    row: str = ""

    @property
    def method(self) -> str:
        return self.row


def runner_up_runs(
    comparison: Comparison, runs: Sequence[PlannedRun], results: Sequence[StudyResult]
) -> dict[PlannedRun, PlannedRun]:
    """Each study's runner-up settings on the scoring seeds: run -> the comparison's run it is
    made from (``runs``: as planned, before the chosen settings), in
    ``<out>/<setting>/<recipe>_runner_up/seed<k>``, without a W&B logger. None for a study
    without a completed runner-up."""
    second = {(r.setting, r.method): r.runner_up for r in results if r.runner_up is not None}
    out: dict[PlannedRun, PlannedRun] = {}
    for run in runs:
        params = second.get((run.setting, run.method))
        if params is None:
            continue
        name = f"{run.method}{SUFFIX}"
        run_dir = comparison.run_dir(run.setting, name, run.seed)
        kept = [a for a in run.args if not a.startswith((ROOT_DIR_ARG, LOGGER_ARG))]
        args = [*with_settings(kept, overrides(params)), f"{ROOT_DIR_ARG}{run_dir}"]
        made = RunnerUpRun(run.recipe, run.setting, run.seed, run_dir, tuple(args), row=name)
        out[made] = run
    return out


def runner_up_gap(
    pairs: Sequence[tuple[Path, Path]], last_k: int
) -> tuple[float, float, int] | None:
    """The runner-up's score minus the chosen settings' on the test set, seed by seed
    (``pairs``: (runner-up's run, chosen's run) directories; a score the mean of the last
    ``last_k`` rounds' ``test/acc``): (mean, 95% half-width, seeds), in fractions; None where
    no pair has finished."""
    gaps = []
    for mine, chosen in pairs:
        if not ((mine / CHECKPOINT).is_file() and (chosen / CHECKPOINT).is_file()):
            continue
        gap = score(load_run(mine), TEST_ACC, last_k) - score(load_run(chosen), TEST_ACC, last_k)
        if math.isfinite(gap):
            gaps.append(gap)
    if not gaps:
        return None
    return float(np.mean(gaps)), ci95(gaps), len(gaps)


def gap_lines(
    comparison: Comparison,
    made: dict[PlannedRun, PlannedRun],
    finals: Sequence[PlannedRun],
) -> list[str]:
    """The *Tuning* section's lines on the runner-up's runs: per setting and method, its test
    score minus the chosen settings', paired over the scoring seeds (points, 95% interval)."""
    if not made:
        return []
    chosen = {(r.setting, r.method, r.seed): r.run_dir for r in finals}
    studies: dict[tuple[str, str], list[tuple[Path, Path]]] = {}
    for run, base in made.items():
        studies.setdefault((base.setting, base.method), []).append(
            (run.run_dir, chosen[(base.setting, base.method, base.seed)])
        )
    lines = [
        "",
        "The selection noise on the test set: each study's runner-up settings also ran on the "
        "scoring seeds (`tune.runner_up`). Its score minus the chosen settings', paired by "
        "seed, in points (95% interval):",
        "",
    ]
    for (setting, method), pairs in studies.items():
        gap = runner_up_gap(pairs, comparison.last_k)
        if gap is None:
            lines.append(f"- {setting} / {method}: no finished pair")
            continue
        mean, half, n = gap
        shown = f"{100 * mean:+.2f}"
        if math.isfinite(half):
            shown += f" [{100 * (mean - half):+.2f}, {100 * (mean + half):+.2f}]"
        lines.append(f"- {setting} / {method}: {shown} over {n} seed" + ("s" if n != 1 else ""))
    return lines
