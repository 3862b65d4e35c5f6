"""A run that is a trial of a tuning study (:mod:`fedlit.comparison.studies`): after each
round it reports its validation score to the study and stops when the study's pruner says so.

A comparison names a trial's run by its ``federation.labels`` (:data:`STUDY`, :data:`STORAGE`,
:data:`TRIAL`, :data:`TRIAL_RUNS`), so ``fedlit fit`` needs nothing else to know it: the same
command line in this process or in a child. The study's file is Optuna's journal, which
several processes append to safely.

A trial runs on each tuning seed, one seed after another. Its score at round ``r`` (step
``r``, as Optuna's pruners count) is the mean over the tuning seeds of their round-``r``
scores: the run of the last tuning seed reports it, once per step, reading the earlier
seeds' rounds from their finished runs, and it alone is pruned. The trial's value is told by
the study's own loop (``study.tell``); a run reports through the study's storage and asks its
pruner (``pruner.prune``), as Optuna's trials do, with no trial object built by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.federation.callbacks import Callback, Ending, RunView
from fedlit.federation.console import warn

STUDY, STORAGE, TRIAL = "study", "storage", "trial"
#: The label naming a trial's run directories, one per tuning seed in order (a JSON list).
TRIAL_RUNS = "trial_runs"
OBJECTIVE, PRUNER = "objective", "pruner"
#: Written into a run directory when its trial is pruned: the round it stopped after.
PRUNED_FILE = "pruned.json"
#: Written into a run directory when a round of its trial failed (every client left out).
FAILED_FILE = "failed.json"


class TrialPruned(Exception):
    """The study's pruner stopped this trial's run after a round (its checkpoint whole)."""


def open_storage(path: str | Path) -> Any:
    """The study storage in ``path``: Optuna's journal file (append-only, file-locked)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


#: Where :func:`repair_journal` sets aside a record cut short (``<journal>.torn``).
TORN_SUFFIX = ".torn"


def repair_journal(path: Path) -> str | None:
    """The studies' journal made whole after a write cut short (a kill, a full disk): its
    last line, where it is not a whole record, set aside in ``<journal>.torn`` and cut off,
    as a kill just before that write would have left it (the trial it told is resumed and
    told again; a trial it drew is drawn again, from the same seed). A line before the last
    that is not a record: returned, naming the file and the line (nothing is changed)."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    offset = 0
    for number, line in enumerate(lines, start=1):
        whole = line.endswith(b"\n")
        if whole:
            try:
                whole = isinstance(json.loads(line), dict)
            except ValueError:
                whole = False
        if not whole and number < len(lines):
            return (
                f"tune: line {number} of {path} is not a whole Optuna record (a write cut "
                "short); the studies cannot be read. Move the file aside to run them afresh, "
                "or give the comparison another out"
            )
        if not whole:
            torn = path.with_name(path.name + TORN_SUFFIX)
            with open(torn, "ab") as f:
                f.write(line if line.endswith(b"\n") else line + b"\n")
            with open(path, "r+b") as f:
                f.truncate(offset)
            warn(
                f"tune: the last record of {path} was cut short (a kill or a full disk during "
                f"its write); set aside in {torn}, and the studies go on from the records before it"
            )
        offset += len(line)
    return None


class ReportToStudy(Callback):
    """After each round, report the trial's score to trial ``trial`` of ``study``: at step
    ``r``, the mean over the trial's runs (``runs``: one per tuning seed, in order; this run
    the last) of their round-``r`` ``objective``, each step once (rounds of an earlier,
    interrupted process too), then ask the pruner; when it prunes, write :data:`PRUNED_FILE`
    and raise :class:`TrialPruned`. A run of an earlier tuning seed reports nothing (the last
    seed's run averages its rounds in). It comes after the checkpoint, so the run stops whole."""

    def __init__(
        self,
        storage: str,
        study: str,
        trial: int,
        objective: str,
        pruner: str,
        runs: Sequence[str] = (),
    ) -> None:
        self.storage, self.study_name, self.number = storage, study, trial
        self.objective, self.pruner, self.runs = objective, pruner, [Path(r) for r in runs]

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        import optuna

        if self.runs and self.runs[-1].resolve() != Path(run.run_dir).resolve():
            return  # an earlier tuning seed's run: the last one reports the mean
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(self.storage)
        study = optuna.load_study(
            study_name=self.study_name, storage=storage, pruner=make_pruner(self.pruner)
        )
        # the trial's id in the storage, from its number (the storage's public reads)
        study_id = storage.get_study_id_from_name(self.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.number)
        reported = storage.get_trial(trial_id).intermediate_values
        for step, value in mean_by_round(run.history, self.runs[:-1], self.objective).items():
            if step not in reported:
                storage.set_trial_intermediate_value(trial_id, step, value)
        trial = storage.get_trial(trial_id)
        if round_idx < run.config.rounds and study.pruner.prune(study, trial):
            marker = {"round": round_idx, "step": round_idx}
            (run.run_dir / PRUNED_FILE).write_text(json.dumps(marker))
            raise TrialPruned(f"trial {self.number} pruned after round {round_idx}")

    def on_run_end(self, run: RunView, ending: Ending) -> None:
        if ending == "failed":  # a diverged setting: the trial fails, its budget spent
            rounds = [int(row["round"]) for row in run.history]
            marker = {"rounds_run": max(rounds, default=0)}
            (run.run_dir / FAILED_FILE).write_text(json.dumps(marker))


def mean_by_round(
    history: Sequence[Mapping[str, float]], earlier: Sequence[Path], objective: str
) -> dict[int, float]:
    """Each round's ``objective`` averaged over a trial's runs: this run's ``history`` and the
    finished runs of its ``earlier`` tuning seeds (read from their metrics); a round some run
    lacks is left out."""
    from fedlit.reporting.runs import load_run

    rows = [list(history)]
    for run_dir in earlier:
        record = load_run(run_dir)
        rows.append([record.summary, *record.history])
    by_run = [
        {int(row["round"]): float(row[objective]) for row in run if objective in row}
        for run in rows
    ]
    rounds = sorted(set.intersection(*(set(values) for values in by_run)))
    return {r: float(np.mean([values[r] for values in by_run])) for r in rounds}


def make_pruner(rule: str) -> Any:
    """Optuna's pruner for ``rule``, ``"<kind>:<startup trials>:<warmup rounds>"``: kind
    "median" (MedianPruner), "halving" (SuccessiveHalvingPruner from ``warmup`` rounds, a
    third kept at each rung) or "none". Optuna keeps no pruner in its storage: the study and
    each trial's run build the same one from this."""
    import optuna

    kind, startup, warmup = rule.split(":")
    if kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(startup), n_warmup_steps=int(warmup)
        )
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, int(warmup)))
    return optuna.pruners.NopPruner()


def trial_callbacks(labels: Mapping[str, str] | None) -> list[Callback]:
    """The callbacks of a run whose labels name a study's trial (none for any other run)."""
    if not labels or STUDY not in labels:
        return []
    return [
        ReportToStudy(
            labels[STORAGE],
            labels[STUDY],
            int(labels[TRIAL]),
            labels.get(OBJECTIVE, "val/acc"),
            labels.get(PRUNER, "none:1:0"),
            json.loads(labels.get(TRIAL_RUNS, "[]")),
        )
    ]
