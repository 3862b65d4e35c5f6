"""A comparison's tuning studies (``tune``, :class:`~fedlit.comparison.tune.TuneSettings`):
one Optuna study per setting and recipe, its trials run through the comparison's runner.

The studies live in one Optuna journal, ``<out>/tune/studies.journal`` (JournalStorage on a
file: append-only and file-locked, so the trials' processes report to it safely, a kill
leaves every record before it whole, and it needs no database). A trial is the recipe's run
with the sampled settings in ``<out>/tune/<setting>/<recipe>/trial<n>/seed<k>``, once per
tuning seed; its run reports each round's validation score to the study and stops when the
pruner says so (:mod:`fedlit.federation.trial`).

A study's budget is counted in rounds: ``trials`` unpruned trials' worth (``trials`` x the
rounds of a run x the tuning seeds), the same for every recipe. A trial the pruner stops
leaves its unrun rounds to more trials, so a study runs at least ``trials`` trials and
spends its budget to within one trial's rounds (:func:`batch_size`).

Trials run in batches of up to ``jobs``: a batch's trials are drawn together by the study's
one sampler (:func:`~fedlit.comparison.sampler.number_seeded_sampler`: trial n's draw seeded
by the sampler's seed and n), run at once, and told to the study when all have ended,
so each draw, each pruning decision and each batch's size sees the trials of the earlier
batches alone. A study is then the same however often it was stopped: a trial left running
by a kill is resumed from its run's checkpoint (or its pruning mark) and told once; a
finished study runs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.comparison.plan import ROOT_DIR_ARG, PlannedRun, plan
from fedlit.comparison.runs import FitFn, execute
from fedlit.comparison.spec import Comparison
from fedlit.comparison.tune import TuneSettings, overrides
from fedlit.federation.children import Children
from fedlit.federation.trial import (
    OBJECTIVE,
    FAILED_FILE,
    PRUNED_FILE,
    PRUNER,
    STORAGE,
    STUDY,
    TRIAL,
    TRIAL_RUNS,
    make_pruner,
    open_storage,
    repair_journal,
)
from fedlit.reporting import load_run

TUNE_DIR = "tune"
SEED_ARG = "--seed_everything="
LOGGER_ARG = "--trainer.logger"


@dataclass(frozen=True)
class TrialRun(PlannedRun):
    """One run of a trial: a :class:`PlannedRun` whose labels also name its study and trial."""

    trial_labels: tuple[tuple[str, str], ...] = ()

    def labels_arg(self) -> str:
        labels = {"method": self.method, "setting": self.setting, "recipe": str(self.recipe)}
        return f"--federation.labels={json.dumps(labels | dict(self.trial_labels))}"


@dataclass
class StudyResult:
    """What one study chose and spent: the best trial (on a tie of scores, the first drawn),
    how many trials tie with it (``ties``, itself included), the completed trials by
    descending score (``completed``), and the runner-up."""

    setting: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    runner_up: dict[str, Any] | None = None
    runner_up_value: float | None = None
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    rounds: int = 0
    seconds: float = 0.0
    best_trial: int | None = None
    runner_up_trial: int | None = None
    ties: int = 1
    completed: tuple[int, ...] = ()


def storage_path(comparison: Comparison) -> Path:
    return Path(comparison.out) / TUNE_DIR / "studies.journal"


def study_name(comparison: Comparison, setting: str, method: str) -> str:
    return f"{comparison.name}/{setting}/{method}"


def pruner_rule(tune: TuneSettings) -> str:
    return f"{tune.pruner}:{tune.startup}:{tune.warmup_rounds}"


def tuning_comparison(comparison: Comparison) -> Comparison:
    """The comparison on the tuning's seeds (its runs' arguments and warm starts)."""
    assert comparison.tune is not None
    return replace(comparison, seeds=list(comparison.tune.seeds), tune=None, report=None)


def with_settings(args: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``args`` with ``extra`` overrides put before the seed (after every other override)."""
    at = next(i for i, a in enumerate(args) if a.startswith(SEED_ARG))
    return [*args[:at], *extra, *args[at:]]


#: A trial's override: it skips ``federation.final_eval`` (its score is its rounds' ``val/*``).
NO_FINAL_EVAL = "--federation.final_eval=[]"
#: A trial's override: it never evaluates the test set, and records its validation images
#: round by round (``federation.val_only``): what its selection noise is measured on.
VAL_ONLY = "--federation.val_only=true"


def trial_run(
    comparison: Comparison, base: PlannedRun, number: int, params: Mapping[str, Any]
) -> TrialRun:
    """The run of trial ``number`` (``params``) for ``base``, a run of the tuning's seeds."""
    assert comparison.tune is not None
    tune = comparison.tune
    run_dir = Path(comparison.out) / TUNE_DIR / base.setting / base.method / f"trial{number}"
    run_dir = run_dir / f"seed{base.seed}"
    kept = [a for a in base.args if not a.startswith((ROOT_DIR_ARG, LOGGER_ARG))]
    # a trial is scored on the validation set each round: no evaluation after its last round,
    # no test set
    extra = [*overrides(params), NO_FINAL_EVAL, VAL_ONLY]
    args = [*with_settings(kept, extra), f"{ROOT_DIR_ARG}{run_dir}"]
    if comparison.wandb is not None:
        args += trial_wandb_args(comparison, base, number, params, run_dir)
    study_key = (base.setting, base.method)
    labels = {
        STUDY: study_name(comparison, *study_key),
        STORAGE: str(storage_path(comparison)),
        TRIAL: str(number),
        TRIAL_RUNS: json.dumps([str(d) for d in trial_dirs(comparison, *study_key, number)]),
        OBJECTIVE: tune.objective,
        PRUNER: pruner_rule(tune),
    }
    return TrialRun(
        base.recipe, base.setting, base.seed, run_dir, tuple(args), tuple(labels.items())
    )


def trial_wandb_args(
    comparison: Comparison,
    base: PlannedRun,
    number: int,
    params: Mapping[str, Any],
    run_dir: Path,
) -> list[str]:
    """A trial's W&B logger: in the comparison's group, tagged ``trial``, with its method,
    setting, seed, trial number and sampled settings in its config."""
    assert comparison.wandb is not None
    config = {"method": base.method, "setting": base.setting, "seed": base.seed}
    config |= {"trial": number, "stage": "trial", **{f"tuned/{k}": v for k, v in params.items()}}
    name = f"{comparison.name}/{base.setting}/{base.method}/trial{number}/seed{base.seed}"
    return [
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
        f"--trainer.logger.init_args.project={comparison.wandb.project}",
        f"--trainer.logger.init_args.name={name}",
        f"--trainer.logger.init_args.save_dir={run_dir}",
        f"--trainer.logger.init_args.offline={str(comparison.wandb.offline).lower()}",
        f"--trainer.logger.dict_kwargs.group={comparison.name}",
        f"--trainer.logger.dict_kwargs.job_type=trial/{base.method}",
        f"--trainer.logger.dict_kwargs.tags=[trial, {base.method}, {base.setting}]",
        f"--trainer.logger.dict_kwargs.config={json.dumps(config)}",
    ]


def trial_score(run_dir: Path, objective: str, last_k: int) -> float:
    """A finished trial run's score: the mean of its last ``last_k`` rounds' ``objective``."""
    values = [row[objective] for row in load_run(run_dir).history if objective in row]
    values = [v for v in values if np.isfinite(v)]
    if not values:
        raise RuntimeError(f"{run_dir}: no {objective} in its metrics")
    return float(np.mean(values[-last_k:]))


def run_studies(
    comparison: Comparison,
    rounds: Callable[[Sequence[str]], int],
    fit: FitFn,
    log: Callable[[str], None] = print,
    children: Children | None = None,
) -> list[StudyResult]:
    """Run every study to its budget of rounds (what is done already is kept), setting by
    setting, recipe by recipe; returns what each chose and spent."""
    import optuna

    from fedlit.comparison.sampler import number_seeded_sampler

    assert comparison.tune is not None
    tune = comparison.tune
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = storage_path(comparison)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(path)
    runs = plan(tuning_comparison(comparison))
    results = []
    for setting in comparison.settings:
        for recipe in comparison.recipes:
            stem = Path(recipe).stem
            bases = [r for r in runs if r.setting == setting and r.method == stem]
            space = tune.space(recipe)
            total = rounds(bases[0].args)
            terms = study_terms(comparison, recipe, bases)
            sampler = number_seeded_sampler(tune.sampler_seed, tune.startup)
            name = study_name(comparison, setting, stem)
            study = _study(storage, name, pruner_rule(tune), terms, sampler)
            distributions = {key: dist.to_optuna() for key, dist in space.items()}

            def one(number: int, params: dict[str, Any]) -> tuple[int, float | str | None]:
                return number, _run_trial(comparison, bases, number, params, total, fit, log)

            per_trial = total * len(tune.seeds)
            while True:
                trials = study.get_trials(deepcopy=False)
                running = [t for t in trials if not t.state.is_finished()]
                finished = [t.number for t in trials if t.state.is_finished()]
                spent = len(rounds_run(comparison, setting, stem, finished))
                size = batch_size(tune.trials * per_trial, spent, per_trial, comparison.jobs)
                if not running and size == 0:
                    break
                first = running[0].number if running else len(trials)
                while len(study.get_trials(deepcopy=False)) < first + max(size, len(running)):
                    study.ask(distributions)
                batch = [
                    (t.number, t.params)
                    for t in study.get_trials(deepcopy=False)
                    if first <= t.number and not t.state.is_finished()
                ]
                log(
                    f"tuning {setting}/{stem}: trials {[n for n, _ in batch]}; {spent} of "
                    f"{tune.trials * per_trial} rounds spent"
                )
                told = _in_parallel(batch, one, comparison.jobs, children)
                for number, value in sorted(told, key=lambda told: told[0]):
                    if value is None:
                        study.tell(number, state=optuna.trial.TrialState.PRUNED)
                    elif value == FAILED:
                        study.tell(number, state=optuna.trial.TrialState.FAIL)
                    else:
                        study.tell(number, value)
            results.append(_result(comparison, study, bases, setting, stem))
    return results


def batch_size(budget: int, spent: int, per_trial: int, jobs: int) -> int:
    """How many trials the next batch draws: as many as ``jobs`` allows whose rounds, all run,
    fit in what is left of the study's ``budget`` of rounds (``spent`` by the finished trials;
    ``per_trial``: a trial's rounds unpruned). 0: the study is done, within ``per_trial``
    rounds of its budget."""
    return max(0, min(jobs, (budget - spent) // per_trial))


def rounds_run(
    comparison: Comparison, setting: str, stem: str, numbers: Sequence[int]
) -> list[dict[str, Any]]:
    """The metrics rows of the rounds the runs of trials ``numbers`` ran (a pruned trial's up
    to its stop; round 0's evaluation left out)."""
    return [
        row
        for number in numbers
        for run_dir in trial_dirs(comparison, setting, stem, number)
        if run_dir.is_dir()
        for row in load_run(run_dir).history
        if row.get("round", 0) >= 1
    ]


def _study(storage: Any, name: str, rule: str, terms: dict[str, Any], sampler: Any) -> Any:
    """The study ``name`` with its one ``sampler``, created on first use with its ``terms``
    (a study that exists is loaded, and its journal gets no record)."""
    import optuna

    pruner = make_pruner(rule)
    try:
        study = optuna.load_study(study_name=name, storage=storage, pruner=pruner, sampler=sampler)
        if TERMS not in study.user_attrs:  # a kill cut the record of its terms
            study.set_user_attr(TERMS, terms)
        return study
    except KeyError:
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", pruner=pruner, sampler=sampler
        )
        study.set_user_attr(TERMS, terms)
        return study


#: A study's user attribute holding what its trials were run with (:func:`study_terms`).
TERMS = "fedlit_terms"


def study_terms(comparison: Comparison, recipe: str, bases: Sequence[PlannedRun]) -> dict[str, Any]:
    """What a study's trials depend on, but the number of trials: its space, seeds, score,
    pruner, sampler and its runs' arguments. A study run with other terms is refused."""
    assert comparison.tune is not None
    tune = comparison.tune
    args = [[a for a in b.args if not a.startswith(LOGGER_ARG)] for b in bases]
    return {
        "space": {key: repr(dist) for key, dist in tune.space(recipe).items()},
        "seeds": list(tune.seeds),
        "objective": [tune.objective, tune.last_k],
        "pruner": pruner_rule(tune),
        "sampler": [tune.sampler_seed, tune.startup],
        "runs": args,
    }


def check_studies(comparison: Comparison) -> str | None:
    """Why the studies already in ``out`` cannot go on under this spec (a study whose terms
    differ from this spec's, named with the first term that does), or None."""
    import optuna

    path = storage_path(comparison)
    if not path.is_file():
        return None
    torn = repair_journal(path)
    if torn:
        return torn
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(path)
    names = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    runs = plan(tuning_comparison(comparison))
    for setting in comparison.settings:
        for recipe in comparison.recipes:
            name = study_name(comparison, setting, Path(recipe).stem)
            if name not in names:
                continue
            bases = [r for r in runs if r.setting == setting and r.method == Path(recipe).stem]
            terms = study_terms(comparison, recipe, bases)
            if TERMS not in names[name].user_attrs:  # its record cut by a kill: written again
                continue
            stored = names[name].user_attrs[TERMS]
            for key, value in terms.items():
                if json.loads(json.dumps(value)) != stored.get(key):
                    return (
                        f"tune: the study {name} in {path} ran with another {key} than this "
                        "spec's; give the comparison another name or out to start afresh"
                    )
    return None


def _in_parallel(
    batch: Sequence[tuple[int, dict[str, Any]]],
    one: Callable[[int, dict[str, Any]], tuple[int, float | str | None]],
    jobs: int,
    children: Children | None,
) -> list[tuple[int, float | str | None]]:
    if jobs == 1 or len(batch) == 1:
        return [one(number, params) for number, params in batch]
    stopping = children.forwarding_signals() if children is not None else nullcontext()
    with stopping, ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, number, params) for number, params in batch]
        return [f.result() for f in futures]


def _run_trial(
    comparison: Comparison,
    bases: Sequence[PlannedRun],
    number: int,
    params: dict[str, Any],
    total: int,
    fit: FitFn,
    log: Callable[[str], None],
) -> float | str | None:
    """Run (or resume) trial ``number`` on every tuning seed; its score, None if pruned,
    :data:`FAILED` if a round of its run failed (every client left out: a diverged setting,
    a trial of the budget all the same). Any other error of its run is raised, the trial left
    running in the study, to be resumed."""
    assert comparison.tune is not None
    scores = []
    for base in bases:
        run = trial_run(comparison, base, number, params)
        marks = (run.run_dir / PRUNED_FILE, run.run_dir / FAILED_FILE)
        if not any(mark.is_file() for mark in marks):
            try:
                execute([run], {run: total}, fit, lambda line: log(f"  trial {number}: {line}"))
            except (Exception, SystemExit):
                if not (run.run_dir / FAILED_FILE).is_file():
                    raise
        if (run.run_dir / PRUNED_FILE).is_file():
            return None
        if (run.run_dir / FAILED_FILE).is_file():
            log(f"  trial {number}: a round failed ({run.run_dir / FAILED_FILE})")
            return FAILED
        scores.append(trial_score(run.run_dir, comparison.tune.objective, comparison.tune.last_k))
    return float(np.mean(scores))


#: What :func:`_run_trial` returns for a trial whose run had a failed round.
FAILED = "failed"


def trial_dirs(comparison: Comparison, setting: str, method: str, number: int) -> list[Path]:
    assert comparison.tune is not None
    folder = Path(comparison.out) / TUNE_DIR / setting / method / f"trial{number}"
    return [folder / f"seed{seed}" for seed in comparison.tune.seeds]


def _result(
    comparison: Comparison, study: Any, bases: Sequence[PlannedRun], setting: str, stem: str
) -> StudyResult:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    values = run_values(comparison, setting, stem, trials)  # the runs', not the journal's
    done = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE and t.number in values),
        key=lambda t: (-values[t.number], t.number),
    )
    result = StudyResult(setting, stem)
    result.complete = len(done)
    result.pruned = sum(t.state == TrialState.PRUNED for t in trials)
    result.failed = sum(t.state == TrialState.FAIL for t in trials)
    history = rounds_run(comparison, setting, stem, [t.number for t in trials])
    result.rounds = len(history)
    result.seconds = sum(r.get("time/round_s", 0.0) for r in history)
    if done:  # a tie: the first drawn (the lowest trial number) is chosen
        result.params, result.value = done[0].params, values[done[0].number]
        result.best_trial = done[0].number
        result.ties = sum(values[t.number] == result.value for t in done)
        result.completed = tuple(t.number for t in done)
    if len(done) > 1:
        result.runner_up, result.runner_up_value = done[1].params, values[done[1].number]
        result.runner_up_trial = done[1].number
    return result


def run_values(
    comparison: Comparison, setting: str, stem: str, trials: Sequence[Any]
) -> dict[int, float]:
    """Each completed trial's score read from its runs' metrics (:func:`trial_score`), not
    from the journal (a value edited there is not a run's); a trial whose runs' metrics are
    gone is left out."""
    assert comparison.tune is not None
    tune = comparison.tune
    values = {}
    for t in trials:
        if t.state.name != "COMPLETE":
            continue
        try:
            scores = [
                trial_score(d, tune.objective, tune.last_k)
                for d in trial_dirs(comparison, setting, stem, t.number)
            ]
        except (OSError, ValueError, RuntimeError):
            continue
        values[t.number] = float(np.mean(scores))
    return values


def final_runs(runs: Sequence[PlannedRun], results: Sequence[StudyResult]) -> list[PlannedRun]:
    """The comparison's runs on its ``seeds``, each with its study's chosen settings (put
    after every other override) and, with W&B, tagged ``final``."""
    chosen = {(r.setting, r.method): overrides(r.params) for r in results}
    out = []
    for run in runs:
        args = with_settings(run.args, chosen.get((run.setting, run.method), []))
        args = [_final_tag(a) for a in args]
        out.append(replace(run, args=tuple(args)))
    return out


def _final_tag(arg: str) -> str:
    tags = "--trainer.logger.dict_kwargs.tags=["
    return f"{tags}final, {arg[len(tags):]}" if arg.startswith(tags) else arg


def tuning_sources(comparison: Comparison) -> list[PlannedRun]:
    """The runs the tuning's runs start from (``init_from``), one per setting and tuning seed."""
    from fedlit.comparison.plan import plan_sources

    return plan_sources(tuning_comparison(comparison))
