"""A comparison's runs kept as their records: the files its report reads (``run.json``,
``config.yaml``, ``hparams.yaml``, ``metrics.csv``, ``val_correct.jsonl``) without their
checkpoints, in a folder small enough to commit, so that a comparison longer than one
machine's life goes on elsewhere: :func:`save_records` copies the finished runs' records
out of ``out``, :func:`restore_records` copies them into another machine's ``out``, and
``fedlit compare`` then runs only what is left.

A finished run kept as its record holds ``record.json`` (``{"round": r}``: the round its
checkpoint had finished, read from that checkpoint when it was saved). A comparison counts it
as finished (:func:`~fedlit.comparison.plan.run_state`), checks its settings against its
``hparams.yaml``, and never removes or overwrites it. Its ``run.json`` gives its warm start's
checkpoint from the run's folder (the run wrote it absolute): a record names no machine's
folders. A source run (``init_from``) keeps its checkpoint while a run of the comparison
that starts from it has not finished: that run starts from it on the next machine.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from fedlit.comparison.plan import INIT_FROM_ARG, PlannedRun, plan, plan_sources, recorded_round
from fedlit.comparison.spec import Comparison
from fedlit.run_layout import CHECKPOINT, RECORD_FILE, RECORD_FILES, RUN_FILE


def _runs(comparison: Comparison) -> list[tuple[PlannedRun, bool]]:
    """Every planned run and whether it is a source run (which keeps its checkpoint)."""
    if comparison.tune is not None:
        raise ValueError(
            "tune: a tuned comparison's choices read its trials' checkpoints; keep its out "
            "whole (records hold untuned comparisons' runs)"
        )
    runs = plan(comparison)
    if comparison.every_label:
        from fedlit.comparison.every_label import every_label_runs  # resolves the baseline

        runs += list(every_label_runs(comparison, runs))
    return [(run, True) for run in plan_sources(comparison)] + [(run, False) for run in runs]


def _finished_round(run_dir: Path) -> int | None:
    """The round a run in ``run_dir`` finished, where it finished all its rounds (its
    checkpoint's, or its record's); None where it did not, or holds nothing."""
    if (run_dir / RECORD_FILE).is_file():
        return recorded_round(run_dir)
    ckpt = run_dir / CHECKPOINT
    if not ckpt.is_file():
        return None
    from fedlit.federation.checkpoint import checkpoint_round, checkpoint_settings

    done, rounds = checkpoint_round(ckpt), checkpoint_settings(ckpt).get("federation.rounds")
    return done if rounds is not None and done >= int(rounds) else None


def _copy(src: Path, dst: Path, keep_checkpoint: bool, done: int) -> None:
    """Copy the record of the finished run in ``src`` into ``dst`` (made, never existing),
    through a temporary folder beside it: a stopped copy leaves no half record."""
    tmp = dst.with_name(f".{dst.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name in RECORD_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    _relative_source(tmp / RUN_FILE, src)
    if keep_checkpoint and (src / CHECKPOINT).is_file():
        (tmp / CHECKPOINT).parent.mkdir()
        shutil.copy2(src / CHECKPOINT, tmp / CHECKPOINT)
    (tmp / RECORD_FILE).write_text(json.dumps({"round": done}) + "\n")
    tmp.rename(dst)


def _relative_source(run_json: Path, run_dir: Path) -> None:
    """A record's warm start's checkpoint from the run's folder, not from the machine's root
    (``run.json``'s ``init_from.path``, absolute as the run wrote it): a record names no
    machine's folders, and reads the same wherever it is restored."""
    if not run_json.is_file():
        return
    meta = json.loads(run_json.read_text())
    source = meta.get("init_from")
    if isinstance(source, dict) and Path(str(source.get("path"))).is_absolute():
        source["path"] = os.path.relpath(source["path"], run_dir.resolve())
        run_json.write_text(json.dumps(meta) + "\n")


def save_records(
    comparison: Comparison, records: str | Path, log: Callable[[str], None] = print
) -> int:
    """Copy each finished run of ``comparison`` from its ``out`` into ``records``, at the same
    place under it: a source run with its checkpoint where a run that starts from it has not
    finished. A run ``records`` holds already is left as it is. Returns how many were copied.
    Runs nothing; ValueError for a tuned comparison, or ``records`` inside ``out``."""
    records, out = Path(records), Path(comparison.out)
    if records.resolve().is_relative_to(out.resolve()):
        raise ValueError(f"records={str(records)!r}: give a folder outside out ({out})")
    runs = _runs(comparison)
    finished = {run: _finished_round(run.run_dir) for run, _ in runs}
    needed = {  # the sources that runs still to run start from
        Path(arg.split("=", 1)[1]).resolve()
        for run, source in runs
        if not source and finished[run] is None
        for arg in run.args
        if arg.startswith(INIT_FROM_ARG)
    }
    copied = 0
    for run, source in runs:
        dst = records / run.run_dir.relative_to(out)
        done = finished[run]
        if done is None or (dst / RECORD_FILE).is_file():
            continue
        if dst.exists():
            raise ValueError(f"{dst}: holds something that is not a run's record; move it")
        _copy(run.run_dir, dst, source and run.run_dir.resolve() in needed, done)
        copied += 1
    log(f"{copied} finished run(s) saved in {records}")
    return copied


def restore_records(
    comparison: Comparison, records: str | Path, log: Callable[[str], None] = print
) -> int:
    """Copy each run's record in ``records`` (:func:`save_records`) into ``comparison``'s
    ``out`` where ``out`` holds nothing of that run; a run ``out`` holds is left as it is.
    Returns how many were copied."""
    records, out = Path(records), Path(comparison.out)
    if not records.is_dir():
        raise ValueError(f"records={str(records)!r}: no such folder")
    copied = 0
    for run, source in _runs(comparison):
        src = records / run.run_dir.relative_to(out)
        if not (src / RECORD_FILE).is_file():
            continue
        if run.run_dir.exists() and any(run.run_dir.iterdir()):
            continue  # out holds this run (or something of it): left as it is
        run.run_dir.parent.mkdir(parents=True, exist_ok=True)
        _copy(src, run.run_dir, source, recorded_round(src))
        copied += 1
    log(f"{copied} finished run(s) restored from {records} into {out}")
    return copied
