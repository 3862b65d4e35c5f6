"""What a run directory holds and the metric keys reports read: names (and the path checks
that read them), no imports of fedlit.

The driver writes these files, and reporting and comparisons read them; all three take the
names from here, so reading runs (``fedlit.reporting``) needs neither torch's training stack
nor the driver.
"""

from __future__ import annotations

from pathlib import Path, PurePath

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

#: The largest seed (``seed_everything``, a comparison's ``seeds``): numpy's seeds are 32-bit.
MAX_SEED = 2**32 - 1

TEST_ACC = "test/acc"  # the scored model's test accuracy, every round
VAL_ACC = "val/acc"  # its accuracy on the server's validation split: what selects a round
BYTES_KEYS = ("comm/bytes_down", "comm/bytes_up")
#: the driver's final evaluations of the global encoder (``federation.final_eval``)
FINAL_EVAL_KEYS = {"finetune": "eval/finetune_acc", "linear": "eval/linear_acc"}


def is_run_dir(folder: Path) -> bool:
    """Whether ``folder`` holds a fedlit run: its ``run.json``, its checkpoint, or the
    ``config.yaml`` and ``hparams.yaml`` a run writes first (a lone ``config.yaml`` may be
    anyone's)."""
    return (
        (folder / RUN_FILE).is_file()
        or (folder / CHECKPOINT).is_file()
        or ((folder / CONFIG_FILE).is_file() and (folder / "hparams.yaml").is_file())
    )


def enclosing_run(path: str | Path) -> Path | None:
    """The run directory (:func:`is_run_dir`) ``path`` is or lies inside, or None."""
    here = Path(path).resolve()
    for folder in (here, *here.parents):
        if is_run_dir(folder):
            return folder
    return None


def output_dir_error(folder: str | Path, key: str, given: str | Path | None = None) -> str | None:
    """Why ``folder`` cannot take the output of ``report``, ``compare`` or ``partition``
    (``key`` names the setting, ``given`` its value where it names a file in ``folder``), or
    None. Creates nothing: a folder that is a run directory or lies inside one (its files are
    the run's), or one whose path passes through a file."""
    path = Path(folder)
    value = str(folder if given is None else given)
    if value == "":
        return f"{key}='': empty; name a folder"
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"lies under {existing}, a file"
        return f"{key}={value!r}: {path} cannot be a folder: it {what}"
    run = enclosing_run(path)
    if run is not None:
        return (
            f"{key}={value!r}: {path} is inside the run directory {run}; "
            "write the output outside any run"
        )
    return None


#: Flat-config keys (and the groups under them) that say where a run is written and read
#: from, what it logs or shows and where its clients run, never what it computes.
PLACEMENT_KEYS = (
    "config",
    "federation.resume",
    "federation.resume_may_change",
    "federation.executor",
    "federation.pool",
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
#: Keys in which runs of one setting may differ and still be seeds of it: the seed, the warm
#: start's source (a comparison's is a run per seed) and the placement keys. Any other
#: difference makes it another setting.
NOT_SETTING_KEYS = ("seed_everything", "federation.init_from", *PLACEMENT_KEYS)
