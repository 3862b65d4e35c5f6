"""Round-level loggers owned by the federation driver."""

from __future__ import annotations

import csv
import os

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
        super().__init__(save_dir=save_dir, name="", version="")

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
