"""What a run directory holds and the metric keys reports read: names only, no imports.

The driver writes these files, and reporting and comparisons read them; all three take the
names from here, so reading runs (``fedlit.reporting``) needs neither torch's training stack
nor the driver.
"""

from __future__ import annotations

from pathlib import PurePath

METRICS_FILE = "metrics.csv"  # one row per round
CONFIG_FILE = "config.yaml"  # the run's full config (config.resumeN.yaml for each resume)
RUN_FILE = "run.json"  # who the run is: method, seed, rounds (and a comparison's setting)
CHECKPOINT = PurePath("checkpoints") / "last.ckpt"  # the last finished round's state
LOCK_FILE = ".lock"  # flock-ed by the process writing the run; holds its pid
#: A directory holding one of these holds a run.
RUN_MARKERS = (METRICS_FILE, "checkpoints", CONFIG_FILE)
#: What a run writes besides its markers (removed with a dead run; other files are kept).
RUN_FILES = (RUN_FILE, "hparams.yaml", "partition.png")

TEST_ACC = "test/acc"  # the scored model's test accuracy, every round
BYTES_KEYS = ("comm/bytes_down", "comm/bytes_up")
#: the driver's final evaluations of the global encoder (``federation.final_eval``)
FINAL_EVAL_KEYS = {"finetune": "eval/finetune_acc", "linear": "eval/linear_acc"}
