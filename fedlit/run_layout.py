"""What a run directory holds and the metric keys reports read: names, the path checks that
read them, and :func:`write_path_error`, the one check of every path fedlit writes (a run
directory, a report's folder, a plot's file); no imports of fedlit.

The driver writes these files, and reporting and comparisons read them; all three take the
names from here, so reading runs (``fedlit.reporting``) needs neither torch's training stack
nor the driver.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePath
from typing import Any, Literal

METRICS_FILE = "metrics.csv"  # one row per round
CONFIG_FILE = "config.yaml"  # the run's full config (config.resumeN.yaml for each resume)
#: A ``federation.val_only`` run's record of its validation images: one JSON line a round,
#: ``{"round": r, "correct": "0110..."}`` (image i right or not, in the split's order; a
#: resumed round's later line wins).
VAL_CORRECT_FILE = "val_correct.jsonl"
RUN_FILE = "run.json"  # who the run is: method, seed, rounds (and a comparison's setting)
HPARAMS_FILE = "hparams.yaml"  # the run's flat config (dotted keys), as its loggers received it
#: run.json's record of the server's training budget (the server's ``budget``): epochs each
#: time the server trains, its bootstrap's epochs, its batches an epoch, the steps of a round
#: that train it. Reports read the budget from here; a run without it has an unknown budget.
BUDGET_KEY = "server_budget"
CHECKPOINT = PurePath("checkpoints") / "last.ckpt"  # the last finished round's state
#: A finished run kept as its record alone, its checkpoint dropped
#: (:mod:`fedlit.comparison.records`): ``{"round": r}``, the round its checkpoint had finished.
#: A directory holding one holds a finished run, never a dead one.
RECORD_FILE = "record.json"
LOCK_FILE = ".lock"  # flock-ed by the process writing the run; holds its pid
#: A directory holding one of these holds a run.
RUN_MARKERS = (METRICS_FILE, "checkpoints", CONFIG_FILE)
#: What a run writes besides its markers (removed with a dead run; other files are kept).
RUN_FILES = (RUN_FILE, HPARAMS_FILE, "partition.png")
#: A run's record: the files reports read (a finished run's record is these and RECORD_FILE).
RECORD_FILES = (RUN_FILE, CONFIG_FILE, HPARAMS_FILE, METRICS_FILE, VAL_CORRECT_FILE)


def created_mode() -> int:
    """The permissions a file created now gets from this process's umask (0o666 without the
    umask's bits: 0o644 under the common 0o022), for a file fedlit writes through a
    temporary file (``tempfile.mkstemp`` creates it 0o600 whatever the umask). Linux reads
    the umask from ``/proc/self/status`` and leaves it unchanged; elsewhere it is set and
    restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def flat_config(config: Any, groups: bool = False) -> dict[str, Any]:
    """A nested config as one level of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``),
    the form of ``hparams.yaml``: a leaf YAML writes as a scalar (None, a bool, a number, a
    string) stays as it is, any other (a list, an object) becomes its ``str``. With
    ``groups``, every group's key too (its value, the group's mapping), as error messages
    that name a group need."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            if groups and prefix:
                flat[prefix] = value
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        else:
            flat[prefix] = str(value)

    walk("", config)
    return flat


#: Settings that moved, as a run written before the move records them -> their key now: the
#: network's settings went into ``model.init_args.network``.
MOVED_KEYS = {
    f"model.init_args.{name}": f"model.init_args.network.{name}"
    for name in ("num_classes", "in_channels", "backbone", "norm", "image_size", "backbone_weights")
}


def current_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """A recorded flat config (``hparams.yaml``, a checkpoint's) with each moved setting
    under its key now (:data:`MOVED_KEYS`), so that runs of either version compare."""
    return {MOVED_KEYS.get(key, key): value for key, value in flat.items()}


#: The largest seed (``seed_everything``, a comparison's ``seeds``): numpy's seeds are 32-bit.
MAX_SEED = 2**32 - 1

#: The prefix of a warm-started run's evaluation before round 1, in row 0: the source's scored
#: network as this run scores it (``warm_start_test/acc``, ``warm_start_test/loss``).
WARM_START_EVAL = "warm_start_test"
TEST_ACC = "test/acc"  # the scored model's test accuracy, every round
VAL_ACC = "val/acc"  # its accuracy on the server's validation split: what selects a round
BYTES_KEYS = ("comm/bytes_down", "comm/bytes_up")
#: the fraction of a round's clients whose unlabeled loss was active (the Contribution callback)
CONTRIBUTED = "client/contributed"
#: how much of the clients' unlabeled data their loss used, as metrics.csv logs it: the
#: confident fraction (FixMatch's and the other pseudo-labelling losses' mask rate; FedSEAL's
#: positive and complementary sets)
ACTIVITY_KEYS = ("client/mask_rate", "pseudo/pos_frac", "pseudo/neg_frac")
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


def enclosing_run(path: str | Path, include_self: bool = True) -> Path | None:
    """The run directory (:func:`is_run_dir`) ``path`` is or lies inside (only lies inside,
    with ``include_self`` False), or None."""
    here = Path(os.path.realpath(path))
    for folder in (here, *here.parents) if include_self else here.parents:
        if is_run_dir(folder):
            return folder
    return None


#: Kernel file systems nothing is ever written into.
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")
#: Room kept below ``PATH_MAX`` for the files fedlit writes inside a folder it is given
#: (``checkpoints/clients/<client>.pt.tmp``, ``<stem>_partition_<setting>.png``).
PATH_ROOM = 100

#: What a path fedlit writes is: a folder of outputs (``report --out``, compare ``out:``), a
#: file (``partition --out``, compare ``report:``) or a run directory (``fit``'s
#: ``trainer.default_root_dir``, a comparison's runs).
PathKind = Literal["folder", "file", "run"]


def write_path_error(
    path: str | Path, key: str, kind: PathKind = "folder", given: str | Path | None = None
) -> str | None:
    """Why fedlit cannot write ``path`` (``key`` names the setting, ``given`` its value where
    it differs from ``path``), or None: the one check of every path fedlit writes, made before
    anything is written. Creates nothing. Refused: an empty path; a name over the file
    system's ``NAME_MAX`` or a path over its ``PATH_MAX``; a symlink loop, or a path under
    one; a dangling symlink; a path under ``/proc``, ``/sys`` or ``/dev``; a path under a
    regular file; a folder (or run directory) that is a file, or a file that is a folder; a
    place this process cannot write; a path inside a run directory (a run directory may be
    one, to resume it, but not lie inside another)."""
    value = str(path if given is None else given)
    shown = f"{key}={_short(value)!r}"
    if not str(path).strip():
        return f"{shown}: empty; name a {'file' if kind == 'file' else 'folder'}"
    absolute = Path.cwd() / path
    error = _length_error(absolute, kind)
    if error:
        return f"{shown}: {error}"
    existing, error = _walk(absolute)
    if error:
        return f"{shown}: {error}"
    resolved = Path(os.path.realpath(absolute))
    for system in PSEUDO_FILESYSTEMS:
        if resolved == Path(system) or Path(system) in resolved.parents:
            return f"{shown}: {resolved} is under {system}, the kernel's, not a place for output"
    if existing == absolute:
        if kind == "file" and absolute.is_dir():
            return f"{shown}: {absolute} is a folder; name a file in it"
        if kind != "file" and not absolute.is_dir():
            return f"{shown}: {absolute} is a file, not a folder"
    folder = existing if existing != absolute or kind != "file" else absolute.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{shown}: cannot write into {folder} (permission denied)"
    run = enclosing_run(resolved, include_self=kind == "folder")
    if run is not None:
        what = "is the run directory" if run == resolved else "lies inside the run directory"
        return f"{shown}: {absolute} {what} {run}; write it outside any run"
    return None


def _limits(folder: Path) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system holding ``folder`` (255, 4096 if unknown)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _length_error(absolute: Path, kind: PathKind) -> str | None:
    """A component over NAME_MAX, or a path (with room for what a folder holds) over
    PATH_MAX, as the file system of ``absolute``'s first existing folder counts them."""
    top = absolute.anchor or "/"
    name_max, path_max = _limits(Path(top))
    for part in absolute.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            return (
                f"the name {_short(part, 24)!r} is {size} bytes long, over the {name_max} of "
                "NAME_MAX"
            )
    size = len(os.fsencode(str(absolute)))
    room = 0 if kind == "file" else PATH_ROOM
    if size + room >= path_max:
        kept = f", less {room} kept for the files written in it" if room else ""
        return f"the path is {size} bytes long, over the {path_max} of PATH_MAX{kept}"
    return None


def _short(value: str, keep: int = 60) -> str:
    """``value``, its middle cut out if it is longer than ``keep`` characters."""
    if len(value) <= keep:
        return value
    return f"{value[: keep // 2]}...{value[-keep // 2 :]}"


def _walk(absolute: Path) -> tuple[Path, str | None]:
    """(the deepest existing part of ``absolute``, why it cannot be written under or None):
    each leading part is looked up as the kernel would (following symlinks), so a loop, a
    dangling symlink or a file on the way is found without creating anything."""
    parts = absolute.parts
    existing = Path(parts[0])
    for i in range(1, len(parts) + 1):
        prefix = Path(*parts[:i])
        try:
            info = os.stat(prefix)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return existing, f"{prefix} is a symlink loop (it resolves to itself)"
            if err.errno == errno.ENOTDIR:
                return existing, f"it lies under {existing}, a file"
            if err.errno == errno.ENOENT:
                if os.path.islink(prefix):
                    target = os.readlink(prefix)
                    return existing, f"{prefix} is a symlink to {target}, which does not exist"
                return existing, None
            if err.errno == errno.ENAMETOOLONG:
                return existing, "the path is longer than the file system allows"
            return existing, f"cannot look up {prefix}: {err.strerror}"
        if i < len(parts) and not stat.S_ISDIR(info.st_mode):
            return prefix, f"it lies under {prefix}, a file"
        existing = prefix
    return existing, None


#: Flat-config keys (and the groups under them) that say where a run is written and read
#: from, what it logs or shows and where its clients run, never what it computes.
PLACEMENT_KEYS = (
    "config",
    "federation.resume",
    "federation.resume_may_change",
    "federation.executor",
    "federation.pool",
    "federation.ray",
    "federation.labels",
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
