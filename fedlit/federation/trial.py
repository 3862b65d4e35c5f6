"""A run that is a trial of a tuning study (:mod:`fedlit.comparison.studies`): after each
round it reports its validation score to the study and stops when the study's pruner says so.

A comparison names a trial's run by its ``federation.labels`` (:data:`STUDY`, :data:`STORAGE`,
:data:`TRIAL`, :data:`STEP`), so ``fedlit fit`` needs nothing else to know it: the same
command line in this process or in a child. The study's file is Optuna's journal, which
several processes append to safely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlit.federation.callbacks import Callback, Ending, RunView
from fedlit.federation.console import warn

STUDY, STORAGE, TRIAL, STEP = "study", "storage", "trial", "step"
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
    """After each round, report its ``objective`` to trial ``trial`` of ``study`` (step
    ``step + round``; rounds of an earlier, interrupted process too, once each), then ask
    the pruner; when it prunes, write :data:`PRUNED_FILE` and raise :class:`TrialPruned`.
    It comes after the checkpoint, so the run stops whole."""

    def __init__(
        self, storage: str, study: str, trial: int, step: int, objective: str, pruner: str
    ) -> None:
        self.storage, self.study_name, self.number = storage, study, trial
        self.step, self.objective, self.pruner = step, objective, pruner

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(self.storage)
        study = optuna.load_study(
            study_name=self.study_name, storage=storage, pruner=make_pruner(self.pruner)
        )
        # the trial's id in the storage, from its number (the storage's public reads)
        study_id = storage.get_study_id_from_name(self.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.number)
        reported = storage.get_trial(trial_id).intermediate_values
        trial = optuna.Trial(study, trial_id)
        for row in run.history:
            step = self.step + int(row["round"])
            if self.objective in row and step not in reported:
                trial.report(float(row[self.objective]), step)
        if round_idx < run.config.rounds and trial.should_prune():
            marker = {"round": round_idx, "step": self.step + round_idx}
            (run.run_dir / PRUNED_FILE).write_text(json.dumps(marker))
            raise TrialPruned(f"trial {self.number} pruned after round {round_idx}")

    def on_run_end(self, run: RunView, ending: Ending) -> None:
        if ending == "failed":  # a diverged setting: the trial fails, its budget spent
            rounds = [int(row["round"]) for row in run.history]
            marker = {"rounds_run": max(rounds, default=0)}
            (run.run_dir / FAILED_FILE).write_text(json.dumps(marker))


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
            int(labels.get(STEP, 0)),
            labels.get(OBJECTIVE, "val/acc"),
            labels.get(PRUNER, "none:1:0"),
        )
    ]
