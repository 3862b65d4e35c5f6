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
HPARAMS_FILE = "hparams.yaml"  # the run's flat config (dotted keys), as its loggers received it
CHECKPOINT = PurePath("checkpoints") / "last.ckpt"  # the last finished round's state
LOCK_FILE = ".lock"  # flock-ed by the process writing the run; holds its pid
#: A directory holding one of these holds a run.
RUN_MARKERS = (METRICS_FILE, "checkpoints", CONFIG_FILE)
#: What a run writes besides its markers (removed with a dead run; other files are kept).
RUN_FILES = (RUN_FILE, HPARAMS_FILE, "partition.png")

TEST_ACC = "test/acc"  # the scored model's test accuracy, every round
VAL_ACC = "val/acc"  # its accuracy on the server's validation split: what selects a round
BYTES_KEYS = ("comm/bytes_down", "comm/bytes_up")
#: the driver's final evaluations of the global encoder (``federation.final_eval``)
FINAL_EVAL_KEYS = {"finetune": "eval/finetune_acc", "linear": "eval/linear_acc"}
#: Flat-config keys (and the groups under them) in which runs of one setting may differ and
#: still be seeds of it: the seed, where a run is written and read from, what it logs or shows,
#: where its clients run. Any other difference makes it another setting.
NOT_SETTING_KEYS = (
    "seed_everything",
    "config",
    "federation.resume",
    "federation.resume_may_change",
    "federation.executor",
    "federation.ray",
    "data.root",
    "data.download",
    "trainer.default_root_dir",
    "trainer.logger",
    "trainer.callbacks",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.enable_checkpointing",
    "trainer.log_every_n_steps",
    "trainer.profiler",
)
