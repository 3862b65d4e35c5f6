"""Round-level loggers owned by the federation driver."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing metrics.csv is continued, not deleted."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(header)


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
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)  # as Lightning writes it
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)
    return len(rows) - len(kept)
