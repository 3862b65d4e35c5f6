"""What a tuned comparison's report says of its tuning: each study's budget (flagged where it
differs from the baseline's by more than 10%), its chosen settings, the validation set's size
and the standard error of an accuracy on it, and the selection noise."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.comparison.report import rerun_id
from fedlit.comparison.selection import (
    accuracy_se,
    flip_rate,
    recorded_scores,
    score_se,
    val_correct,
    within_one_se,
)
from fedlit.comparison.spec import Comparison
from fedlit.comparison.studies import StudyResult, trial_dirs, trial_run, tuning_comparison

#: A budget further than this from the baseline's (relative) is flagged.
BUDGET_TOLERANCE = 0.10


@dataclass
class Noise:
    """A study's validation noise, on the score its choice is made on where its trials
    recorded their images (``score``: what was resampled): the split's size, the chosen
    trial's score on it and its standard error, how often resampled splits choose the
    runner-up, and how many of the other completed trials score within one paired standard
    error of the chosen one (``within`` of ``others``; None where not measured). ``score``
    "last round" where each final network was scored once (trials of an earlier fedlit)."""

    n_val: int
    accuracy: float
    se: float
    flips: float | None
    score: str = "last round"
    within: int | None = None
    others: int = 0


def selection_noise(
    comparison: Comparison, result: StudyResult, draws: int = 2000
) -> Noise | None:
    """The chosen trial's and the runner-up's scores image by image on each tuning seed's
    validation split, then :func:`~fedlit.comparison.selection.flip_rate`. Where the trials
    recorded their images (``federation.val_only``), the scores are the study's own: each
    image's correctness over the last ``tune.last_k`` rounds (and every other completed
    trial is set against the chosen one, :func:`~fedlit.comparison.selection.within_one_se`);
    otherwise each final network is scored once (its runs must have finished: a pruned
    runner-up is never one)."""
    if result.best_trial is None:
        return None
    assert comparison.tune is not None
    from fedlit.comparison.plan import plan

    last_k = comparison.tune.last_k
    bases = [
        r
        for r in plan(tuning_comparison(comparison))
        if r.setting == result.setting and r.method == result.method
    ]

    def recorded(number: int) -> list[np.ndarray] | None:
        dirs = trial_dirs(comparison, result.setting, result.method, number)
        scores = [recorded_scores(d, last_k) for d in dirs]
        return None if any(s is None for s in scores) else [s for s in scores if s is not None]

    def correct(number: int, params: dict[str, Any]) -> list[np.ndarray]:
        runs = [trial_run(comparison, base, number, params) for base in bases]
        return [val_correct(run.args, run.run_dir, run.seed) for run in runs]

    best = recorded(result.best_trial)
    if best is None:  # trials of an earlier fedlit: their final networks
        best = correct(result.best_trial, result.params)
        n = sum(len(c) for c in best)
        acc = float(np.mean(np.concatenate(best))) if n else float("nan")
        flips = None
        if result.runner_up_trial is not None and result.runner_up is not None and n:
            other = correct(result.runner_up_trial, result.runner_up)
            flips = flip_rate(best, other, draws)
        return Noise(n, acc, accuracy_se(acc, n), flips)
    n = sum(len(c) for c in best)
    acc = float(np.mean(np.concatenate(best))) if n else float("nan")
    others = [recorded(t) for t in result.completed if t != result.best_trial]
    kept = [o for o in others if o is not None]
    flips = None
    if result.runner_up_trial is not None and n:
        runner_up = recorded(result.runner_up_trial)
        flips = flip_rate(best, runner_up, draws) if runner_up is not None else None
    score = f"last {last_k} rounds" if last_k > 1 else "val/acc"
    within = within_one_se(best, kept) if n and len(kept) == len(others) else None
    return Noise(n, acc, score_se(best), flips, score, within, len(others))


def tuning_lines(
    comparison: Comparison,
    results: Sequence[StudyResult],
    noise: Mapping[tuple[str, str], Noise | None],
) -> list[str]:
    """The report's *Tuning* section (Markdown lines)."""
    assert comparison.tune is not None
    tune = comparison.tune
    base = {r.setting: r for r in results if r.method == comparison.baseline}
    score = (
        f"the mean of its last {tune.last_k} rounds' `{tune.objective}`"
        if tune.last_k > 1
        else f"its last round's `{tune.objective}`"
    )
    lines = [
        "",
        "### Tuning",
        "",
        "Every recipe was tuned in every setting with the same budget: the rounds of "
        f"{tune.trials} unpruned trials (a pruned trial leaves its unrun rounds to more "
        f"trials), drawn by Optuna's TPE sampler (seed {tune.sampler_seed}; random draws for "
        f"the first {tune.startup}), pruned by the `{tune.pruner}` rule over rounds, on the "
        f"tuning seeds {list(tune.seeds)} (the results are scored on "
        f"{list(comparison.seeds)}, which the tuning never saw). A trial's score: {score} on "
        "the server's validation set (mean "
        "over the tuning seeds); a trial never evaluates the test set "
        "(`federation.val_only`). The scored runs take the best trial's settings; on a tie "
        "of scores, the first drawn (the lowest trial number).",
        "",
        "- *budget*: trials completed / pruned (and failed: a round with every client left "
        "out), rounds run by all of a study's trials and their "
        "wall-clock seconds; `!` where the rounds differ from the baseline's by more than "
        f"{BUDGET_TOLERANCE:.0%} (seconds differ by method by construction: the baseline "
        "trains no client).",
        "- *val n, SE*: the validation images the choice was made on (over the tuning seeds) "
        "and the standard error of the chosen trial's score on them (each image's score: "
        "its correctness over the rounds the trial's score averages; the std of those over "
        "sqrt(n)).",
        "- *flip*: how often the runner-up scores higher than the chosen trial (a tie counts "
        "half) on the validation images resampled with replacement (2000 draws, the two "
        "trials scored image by image on the score the choice is made on).",
        "- *ties*: the completed trials whose score equals the chosen one's (itself "
        "included). *within 1 SE*: the other completed trials whose score is within one "
        "paired standard error of the chosen one's (the std of the image-by-image "
        "differences over sqrt(n): the same images for both), of all of them.",
        "",
        "| setting | method | trials (done / pruned) | rounds | seconds | best val | "
        "val n, SE | flip | ties | within 1 SE | chosen settings |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ref = base.get(r.setting)
        flag = ""
        if ref is not None and abs(r.rounds - ref.rounds) > BUDGET_TOLERANCE * ref.rounds:
            flag = " !"
        n = noise.get((r.setting, r.method))
        val = f"{n.n_val}, {100 * n.se:.2f}" if n else "-"
        flip = f"{100 * n.flips:.0f}%" if n and n.flips is not None else "-"
        best = f"{100 * r.value:.2f}" if r.value is not None else "-"
        chosen = ", ".join(f"`{k.split('.')[-1]}={_short(v)}`" for k, v in r.params.items())
        failed = f" / {r.failed} failed" if r.failed else ""
        ties = f"{r.ties}" if r.value is not None else "-"
        within = f"{n.within} of {n.others}" if n and n.within is not None else "-"
        if n and n.score == "last round":  # trials of an earlier fedlit: their final networks
            val += " (last round)"
        lines.append(
            f"| {r.setting} | {r.method} | {r.complete} / {r.pruned}{failed} | {r.rounds}{flag} | "
            f"{r.seconds:.0f} | {best} | {val} | {flip} | {ties} | {within} | {chosen or '-'} |"
        )
    return lines


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary_rows(
    results: Sequence[StudyResult], noise: Mapping[tuple[str, str], Noise | None]
) -> tuple[list[str], list[list[Any]]]:
    """The tuning summary as a table's columns and rows (W&B)."""
    rows = []
    for r in results:
        n = noise.get((r.setting, r.method))
        row = {
            "setting": r.setting,
            "method": r.method,
            "complete": r.complete,
            "pruned": r.pruned,
            "failed": r.failed,
            "rounds": r.rounds,
            "seconds": round(r.seconds, 1),
            "best_val": r.value,
            "n_val": n.n_val if n else None,
            "val_se": n.se if n else None,
            "flip_rate": n.flips if n else None,
            "ties": r.ties if r.value is not None else None,
            "within_1se": n.within if n else None,
            "chosen": ", ".join(f"{k}={_short(v)}" for k, v in r.params.items()),
        }
        rows.append(row)
    columns = list(rows[0]) if rows else []
    return columns, [list(row.values()) for row in rows]


def log_tuning_to_wandb(
    comparison: Comparison,
    results: Sequence[StudyResult],
    noise: Mapping[tuple[str, str], Noise | None],
    init: Callable[..., Any] | None = None,
) -> Path:
    """One W&B run in the comparison's group (``job_type`` "tuning") holding the tuning
    summary as a table (the same run at each re-run, :func:`~fedlit.comparison.report.rerun_id`);
    returns its local directory."""
    import wandb

    assert comparison.wandb is not None
    columns, rows = summary_rows(results, noise)
    run = (init or wandb.init)(
        project=comparison.wandb.project,
        group=comparison.name,
        name=f"{comparison.name}/tuning",
        id=rerun_id(comparison.wandb.project, comparison.name, comparison.out, "tuning"),
        resume="allow",
        job_type="tuning",
        dir=str(comparison.out),
        mode="offline" if comparison.wandb.offline else "online",
        config={"trials": comparison.tune.trials if comparison.tune else 0},
    )
    run.log({"tuning": wandb.Table(columns=list[str | int](columns), data=rows)})
    directory = Path(run.dir).parent
    run.finish()
    return directory

