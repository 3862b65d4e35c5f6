"""Round-level loggers owned by the federation driver."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from fedlit.federation.checkpoint import WriteFailed, write_atomically, write_error
from fedlit.run_layout import TEST_ACC, VAL_ACC

#: How a W&B run summarises fedlit's metrics (its runs table, its charts' legends): the best
#: validation accuracy (the round a run may select without the test set) and the last test
#: accuracy (the report's final value).
WANDB_SUMMARIES = {VAL_ACC: "max", TEST_ACC: "last"}


def start_wandb(logger: Logger) -> None:
    """Start a :class:`~lightning.pytorch.loggers.WandbLogger`'s run (other loggers are left
    alone) with :data:`WANDB_SUMMARIES` declared (``define_metric``), and, inside
    :func:`quiet_wandb`, W&B's ``quiet`` setting. Lightning passes W&B an ``anonymous``
    setting even where none was given, and W&B warns of every one that it has no effect: one
    left unset (None) is not passed."""
    if not isinstance(logger, WandbLogger):
        return
    if logger._experiment is None:  # what Lightning passes wandb.init, the run not started
        init = logger._wandb_init
        if init.get("anonymous", False) is None:
            del init["anonymous"]
        if _quiet and init.get("settings") is None:
            init["settings"] = {"quiet": True}
    for key, summary in WANDB_SUMMARIES.items():
        logger.experiment.define_metric(key, summary=summary)


_quiet = False


@contextmanager
def quiet_wandb() -> Iterator[None]:
    """W&B's ``quiet`` setting for the W&B runs :func:`start_wandb` starts inside, in this
    process (unless their logger was given settings of its own): W&B prints no block of a
    run's history and last values when the run ends, only its essential lines. A comparison's
    runs are quiet, so that its results table is the last thing it prints. (Not W&B's
    ``WANDB_QUIET``: W&B warns when its variables change after its first run, and passed
    through the CLI as ``wandb.init``'s ``settings`` the setting becomes a whole
    ``wandb.Settings`` of defaults, ``mode`` online among them.)"""
    global _quiet
    before, _quiet = _quiet, True
    try:
        yield
    finally:
        _quiet = before


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing metrics.csv is continued, not deleted,
    and that no failed write (a full disk) can damage a row written before: a new column
    rewrites the file to a temporary name and renames it into place (Lightning rewrites it in
    place), and a failed append cuts the file back to its earlier length. Either failure
    raises :class:`~fedlit.federation.checkpoint.WriteFailed` naming the file and the free
    space."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(header)

    def save(self) -> None:
        """Lightning's ``save``, written so that a failure keeps every earlier row."""
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        keys = list(self.metrics_keys)
        new_keys = self._record_new_keys()
        exists = path.is_file()
        if new_keys and exists:
            try:
                self._rewrite_with_new_header(self.metrics_keys)
            except WriteFailed:
                self.metrics_keys = keys  # the header on disk: the new columns come again
                raise
        size = path.stat().st_size if exists else 0
        try:
            with open(path, "a" if exists else "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                if not exists:
                    writer.writeheader()
                writer.writerows(self.metrics)
        except BaseException as err:  # a full disk, or a SIGTERM mid-row
            if exists:  # whatever part of the new rows was written goes
                with open(path, "r+b") as f:
                    f.truncate(size)
            else:
                path.unlink(missing_ok=True)
                self.metrics_keys = keys
            if isinstance(err, OSError):
                raise WriteFailed(path, write_error(err) or str(err)) from err
            raise
        self.metrics = []

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        path = Path(self.metrics_file_path)
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))

        def write(tmp: Path) -> None:
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fieldnames)
                writer.writeheader()
                writer.writerows(rows)

        write_atomically(path, write)


class RoundCSVLogger(CSVLogger):
    """CSVLogger writing ``metrics.csv`` straight into ``save_dir``, one row per step (round).

    A resumed run appends to the file it finds (Lightning's own CSVLogger would delete it).
    """

    def __init__(self, save_dir: str | os.PathLike) -> None:
        super().__init__(save_dir=os.fspath(save_dir), name="", version="")

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        assert isinstance(self._experiment, ExperimentWriter)
        return self._experiment


def drop_rounds_after(path: Path, last_round: int) -> int:
    """Remove the rows of ``metrics.csv`` at ``path`` logged after round ``last_round`` (a
    run killed between writing a round's row and its checkpoint logged that round once
    already; its resume logs it again). The file is rewritten atomically; returns how many
    rows were removed."""
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    kept = [r for r in rows if not r.get("round") or float(r["round"]) <= last_round]
    if len(kept) == len(rows):
        return 0

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)  # as Lightning writes it
            writer.writeheader()
            writer.writerows(kept)

    write_atomically(path, write)
    return len(rows) - len(kept)
