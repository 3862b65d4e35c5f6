"""A tuned comparison's steps between its source runs and its scored runs
(:func:`tune_runs`): the tuning's own source runs, the studies, their selection noise, and the
scored runs with each study's chosen settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fedlit.comparison.plan import PlannedRun
from fedlit.comparison.runs import FitFn, execute
from fedlit.comparison.runner_up import gap_lines, runner_up_runs
from fedlit.comparison.spec import Comparison
from fedlit.comparison.studies import (
    StudyResult,
    final_runs,
    run_studies,
    trial_dirs,
    tuning_sources,
)
from fedlit.comparison.tune_report import (
    Noise,
    log_tuning_to_wandb,
    selection_noise,
    tuning_lines,
)
from fedlit.federation.children import Children
from fedlit.run_layout import CHECKPOINT


@dataclass
class Tuning:
    """What the tuning gives the rest of the comparison: its scored runs (with the chosen
    settings), and what its report and W&B say of the studies."""

    comparison: Comparison
    runs: list[PlannedRun]
    results: list[StudyResult]
    noise: dict[tuple[str, str], Noise | None] = field(default_factory=dict)
    runner_up: dict[PlannedRun, PlannedRun] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lines = [*tuning_lines(self.comparison, self.results, self.noise), *self.notes()]
        return lines + gap_lines(self.comparison, self.runner_up, self.runs)

    def notes(self) -> list[str]:
        """What the table cannot say: a study none of whose trials completed (its scored runs
        take the recipe's own settings, which may lie outside its range), a study whose
        selection noise could not be measured (its trials' checkpoints gone)."""
        notes = []
        for r in self.results:
            if r.best_trial is None:
                notes.append(
                    f"- **{r.setting}/{r.method} is not tuned**: none of its trials completed "
                    f"({r.pruned} pruned, {r.failed} failed); its scored runs take the recipe's "
                    "own settings, which may lie outside its range."
                )
            elif self.noise.get((r.setting, r.method)) is None:
                notes.append(
                    f"- {r.setting}/{r.method}: *val n, SE* and *flip* not measured: a chosen "
                    "or runner-up trial's checkpoint is gone."
                )
        return ["", *notes] if notes else []

    def log_to_wandb(self) -> None:
        log_tuning_to_wandb(self.comparison, self.results, self.noise)


def _noise(
    comparison: Comparison, result: StudyResult, log: Callable[[str], None]
) -> Noise | None:
    """:func:`selection_noise`, or None (said in the log) where a trial it scores has no
    checkpoint left (deleted to free disk: its metrics still give the study's choice)."""
    trials = [t for t in (result.best_trial, result.runner_up_trial) if t is not None]
    for number in trials:
        for run_dir in trial_dirs(comparison, result.setting, result.method, number):
            if not (run_dir / CHECKPOINT).is_file():
                gone = run_dir / CHECKPOINT
                log(f"{result.setting}/{result.method}: no selection noise, {gone} is gone")
                return None
    return selection_noise(comparison, result)


def tune_runs(
    comparison: Comparison,
    runs: Sequence[PlannedRun],
    per_run: dict[PlannedRun, int],
    rounds: Callable[[Sequence[str]], int],
    fit: FitFn,
    log: Callable[[str], None] = print,
    children: Children | None = None,
) -> Tuning:
    """Run the tuning's source runs (``init_from`` on the tuning seeds) and every study,
    measure each study's selection noise, and return the comparison's ``runs`` with the
    chosen settings (``per_run`` learns their rounds)."""
    sources = tuning_sources(comparison)
    if sources:
        configured = {s: rounds(s.args) for s in sources}
        execute(sources, configured, fit, log, comparison.jobs, children)
    results = run_studies(comparison, rounds, fit, log, children)
    noise = {(r.setting, r.method): _noise(comparison, r, log) for r in results}
    finals = final_runs(runs, results)
    for run, final in zip(runs, finals, strict=True):
        per_run[final] = per_run[run]
    second: dict[PlannedRun, PlannedRun] = {}
    if comparison.tune is not None and comparison.tune.runner_up:  # on the scoring seeds
        second = runner_up_runs(comparison, runs, results)
        counted = {run: per_run[base] for run, base in second.items()}
        execute(list(second), counted, fit, log, comparison.jobs, children)
    return Tuning(comparison, finals, results, noise, second)
