"""A comparison's spec (the ``fedlit compare`` config): what it runs and reports, checked
as it is built, before anything runs (:class:`Comparison`), and where each run goes."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

from fedlit.comparison.tune import TuneSettings
from fedlit.run_layout import MAX_SEED, write_path_error

#: The ``fedlit fit`` settings a comparison gives each run itself, and what to give instead:
#: an override of one would be overridden in turn (or the run would go elsewhere), while the
#: report listed it as given.
COMPARISON_SETS = {
    "seed_everything": "the comparison gives each run its seed: list them in `seeds`",
    "trainer.default_root_dir": "the comparison puts each run in `out`",
    "federation.labels": "the comparison names each run by its recipe, setting and seed",
    "federation.resume": "the comparison resumes an interrupted run itself",
}


def _set_key(arg: str) -> str:
    """The setting a ``fedlit fit`` argument sets (``--a.b=1`` and ``--a.b`` -> ``a.b``)."""
    return arg[2:].split("=", 1)[0] if arg.startswith("--") else ""


def owned_override(where: str, args: list[str], owned: dict[str, str]) -> str | None:
    """The refusal of the first of ``args`` (the overrides at ``where``) that sets one of the
    settings the comparison sets itself (``owned``: setting -> why), or a key inside it;
    None where none does."""
    for arg in args:
        key = _set_key(arg)
        for name, why in owned.items():
            if key == name or key.startswith(name + "."):
                return f"{where}: {arg!r} sets {name}, which this comparison sets itself ({why})"
    return None


@dataclass(frozen=True)
class WandbSettings:
    """Where a comparison's runs go on W&B: one ``group`` per comparison.

    Args:
        project: the W&B project.
        offline: log to local files only (``wandb sync`` uploads them later).
    """

    project: str = "fedlit"
    offline: bool = False


#: The executors a comparison's ``executor`` may name.
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class RayCluster:
    """Where a comparison's runs go with ``executor: ray``, and what each run takes there.

    Args:
        address: the Ray cluster's address: ``auto`` (the cluster this machine is a node
            of), ``host:port`` or ``ray://host:port``. None starts Ray on this machine alone.
        cpus: CPUs each run takes on its node (its torch threads).
        gpus: GPUs each run takes on its node; fractions share a GPU (0.5: two runs on one).
        max_retries: times Ray runs a run again whose worker process died, or whose
            ``fedlit fit`` was killed by a signal; it resumes from its checkpoint.
        connect_timeout: seconds to wait for ``address`` to answer before the comparison is
            refused.
    """

    address: str | None = None
    cpus: float = 1.0
    gpus: float = 0.0
    max_retries: int = 3
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        for key, bound in (("cpus", "> 0"), ("gpus", ">= 0"), ("connect_timeout", "> 0")):
            value = getattr(self, key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            bad = not number or not math.isfinite(value) or value < 0
            if bad or (value == 0 and bound == "> 0"):
                raise ValueError(f"ray.{key} must be a number {bound}, got {value!r}")
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"ray.max_retries must be an integer >= 0, got {retries!r}")


@dataclass(frozen=True)
class SourceRun:
    """The run every run of a comparison starts from (``federation.init_from``): the recipe
    run once per setting and seed, before the others, in ``<out>/<setting>/<folder>/seed<k>``,
    with the comparison's overrides, the setting's, then its own (which win), and the seed.
    Settings that differ only in the clients' partition share one, seed by seed, where its
    method trains no clients (:func:`~fedlit.comparison.plan.source_settings`).

    Args:
        recipe: its recipe file (e.g. a Server-SL trained to its plateau).
        overrides: its own overrides, after the comparison's and the setting's.
        folder: the name of its folder in each setting's directory.
    """

    recipe: str
    overrides: list[str] = field(default_factory=list)
    folder: str = "init_from"


@dataclass(frozen=True)
class Comparison:
    """What a comparison runs and reports (the ``fedlit compare`` config).

    Args:
        name: the comparison's name (also the W&B group), and that of its report's files in
            ``out`` (``<name>.md``, ``<name>.csv``, ``<name>_curves.png``, ...): comparisons
            of other names can share one ``out``, e.g. one that adds a recipe to another's
            runs, whose finished runs it skips.
        recipes: recipe files; each recipe's file stem names its method in the results.
        seeds: run seeds (``seed_everything``): the partition, sampling and initialisation.
        settings: setting name -> overrides for it (e.g. ``noniid: [--data.partitioner=...]``);
            one column group of the results per setting.
        overrides: overrides for every run (e.g. fewer rounds, a smaller backbone).
        recipe_overrides: recipe stem -> overrides for that recipe's runs alone, after the
            comparison's and the setting's: a setting the other recipes do not take, e.g.
            ``fedseal: [--model.init_args.bootstrap_epochs=0]``.
        out: the comparison's directory: its runs, their logs and its report's files.
        target: report the first round each run reaches this test accuracy.
        baseline: a recipe stem (e.g. ``server_sl``) every method is compared with, seed by
            seed: the paired difference of the score, in points, with its 95% interval.
        calibration: the protocol's calibration, in points: each setting's summary says
            whether the oracle (the recipe marked so: FedAvg-SL) is that far above ``baseline``
            (:func:`~fedlit.reporting.table.calibration_verdict`; needs ``baseline``).
        last_k: a run's score is the mean of its last ``last_k`` rounds' test accuracy.
        report: also write the Markdown report here (plots beside it).
        published: recipe stem -> setting -> a paper's accuracy (percent), shown beside ours.
        wandb: log every run to W&B (None: no W&B).
        description: Markdown lines that open the report (the protocol in words).
        init_from: a run per setting and seed that every run of that setting and seed starts
            from (:class:`SourceRun`, ``federation.init_from``); run first. None: every run
            starts afresh.
        jobs: runs at a time. 1 runs them one after another in this process; more runs each in
            its own ``fedlit fit`` process with torch limited to (CPU cores // jobs) threads
            (``OMP_NUM_THREADS``: processes that each take every core slow each other down
            many times over), its output in ``<out>/logs/``. With ``executor: ray``, the runs
            on the cluster at a time (and the trials a study draws together).
        executor: where the runs run: ``local`` (processes on this machine) or ``ray``
            (each run a Ray task on a node with ``ray.cpus`` and ``ray.gpus`` free, over an
            ``out`` every node sees at the same path; needs fedlit's ray extra).
        ray: the Ray cluster and each run's resources, with ``executor: ray``
            (:class:`RayCluster`).
        tune: tune every recipe in every setting before scoring it (:class:`TuneSettings`):
            its studies' runs go to ``<out>/tune/``, and the runs on ``seeds`` take the best
            trial's settings. None: the recipes as they are.
        every_label: add a row ``<baseline>_every_label``: the baseline's recipe (at its
            study's chosen settings in a tuned comparison), untuned, on ``seeds``, trained on
            the training and validation labels together (``data.labeled_per_class`` +
            ``val_per_class``, no validation set): what holding the validation labels back
            cost (:mod:`fedlit.comparison.every_label`). Needs a ``baseline`` whose runs give
            both as numbers per class.
    """

    name: str
    recipes: list[str]
    seeds: list[int] = field(default_factory=lambda: [0])
    settings: dict[str, list[str]] = field(default_factory=lambda: {"default": []})
    overrides: list[str] = field(default_factory=list)
    recipe_overrides: dict[str, list[str]] = field(default_factory=dict)
    out: str = "runs/compare"
    target: float | None = None
    baseline: str | None = None
    calibration: float | None = None
    last_k: int = 1
    report: str | None = None
    published: dict[str, dict[str, float]] = field(default_factory=dict)
    wandb: WandbSettings | None = None
    description: list[str] = field(default_factory=list)
    jobs: int = 1
    init_from: SourceRun | None = None
    tune: TuneSettings | None = None
    every_label: bool = False
    executor: str = "local"
    ray: RayCluster = field(default_factory=RayCluster)

    def __post_init__(self) -> None:
        if not self.name or Path(self.name).name != self.name or self.name in (".", ".."):
            raise ValueError(
                f"name={self.name!r}: give one file name (the report files written into `out` "
                "are named after it)"
            )
        if not self.recipes:
            raise ValueError("recipes: give at least one recipe")
        missing = [r for r in self.recipes if not Path(r).is_file()]
        if missing:
            raise ValueError(f"recipes: no such file {missing[0]!r}")
        stems = [Path(r).stem for r in self.recipes]
        if len(set(stems)) != len(stems):
            raise ValueError(f"recipes: two recipes share a file name ({stems})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give distinct seeds, got {self.seeds}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise ValueError(f"seeds: {seed!r} is not a seed (an integer in [0, {MAX_SEED}])")
        if not self.settings:
            raise ValueError("settings: give at least one setting")
        if self.init_from is not None:
            if not Path(self.init_from.recipe).is_file():
                raise ValueError(f"init_from.recipe: no such file {self.init_from.recipe!r}")
            folder = self.init_from.folder
            if not folder or Path(folder).name != folder or folder in stems or folder == "logs":
                raise ValueError(
                    f"init_from.folder={folder!r}: name one folder that is no recipe's ({stems})"
                )
        error = self._owned_override()
        if error:
            raise ValueError(error)
        unknown = [stem for stem in self.recipe_overrides if stem not in stems]
        if unknown:
            raise ValueError(f"recipe_overrides: {unknown[0]!r} is not one of the recipes {stems}")
        if self.baseline is not None and self.baseline not in stems:
            raise ValueError(f"baseline: {self.baseline!r} is not one of the recipes {stems}")
        if self.calibration is not None:
            if self.baseline is None:
                raise ValueError(
                    f"calibration={self.calibration}: give a baseline (the oracle's difference "
                    "from it is what is calibrated)"
                )
            if (
                isinstance(self.calibration, bool)
                or not isinstance(self.calibration, (int, float))
                or not math.isfinite(self.calibration)
            ):
                raise ValueError(
                    f"calibration must be a number of points, got {self.calibration!r}"
                )
        if isinstance(self.last_k, bool) or not isinstance(self.last_k, int) or self.last_k < 1:
            raise ValueError(f"last_k must be a positive integer, got {self.last_k!r}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"jobs must be a positive integer, got {self.jobs!r}")
        error = executor_error(self.executor)
        if error:
            raise ValueError(error)
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target}")
        if self.tune is not None:
            if "tune" in self.settings:
                raise ValueError("settings: 'tune' names the tuning's folder; rename the setting")
            self.tune.check(self.recipes, self.seeds)
        if not isinstance(self.every_label, bool):
            raise ValueError(f"every_label must be true or false, got {self.every_label!r}")
        if self.every_label and self.baseline is None:
            raise ValueError("every_label: give a baseline (the row is its recipe)")
        if self.every_label and f"{self.baseline}_every_label" in stems:
            raise ValueError(f"every_label: a recipe is named {self.baseline}_every_label")
        error = write_path_error(self.out, "out", "folder")
        if error is None and self.report is not None:
            error = write_path_error(self.report, "report", "file")
        runs = [(s, stem, seed) for s in self.settings for stem in stems for seed in self.seeds]
        for setting, stem, seed in runs if error is None else ():
            error = write_path_error(
                self.run_dir(setting, stem, seed), f"settings.{setting}", "run"
            )
            if error:
                break
        if error:
            raise ValueError(error)

    def _owned_override(self) -> str | None:
        """The refusal of an override of a setting the comparison gives each run itself
        (:data:`COMPARISON_SETS`; the warm start's source with ``init_from``, the logger with
        ``wandb``), in ``overrides``, ``settings``, ``recipe_overrides`` or ``init_from``'s
        overrides; None where there is none."""
        owned = dict(COMPARISON_SETS)
        if self.init_from is not None:
            owned["federation.init_from"] = "the spec's init_from gives each run its source"
        if self.wandb is not None:
            owned["trainer.logger"] = "the spec's wandb sets each run's logger"
        places = [
            ("overrides", self.overrides),
            *((f"settings.{name}", args) for name, args in self.settings.items()),
            *((f"recipe_overrides.{stem}", args) for stem, args in self.recipe_overrides.items()),
        ]
        if self.init_from is not None:
            places.append(("init_from.overrides", self.init_from.overrides))
        for where, args in places:
            error = owned_override(where, list(args), owned)
            if error:
                return error
        return None

    def run_dir(self, setting: str, folder: str, seed: int) -> Path:
        """Where the run of ``setting``, ``folder`` (a recipe's stem, or ``init_from``'s
        folder) and ``seed`` is written: ``<out>/<setting>/<folder>/seed<k>``."""
        return Path(self.out) / setting / folder / f"seed{seed}"


def executor_error(name: str) -> str | None:
    """The refusal of an ``executor`` that is not one of :data:`EXECUTORS`, or of ``ray``
    where Ray is not installed (naming the extra to install); None where it can run."""
    if name not in EXECUTORS:
        return f"executor must be one of {EXECUTORS}, got {name!r}"
    if name == "ray" and importlib.util.find_spec("ray") is None:
        return (
            "executor='ray': Ray is not installed here; install fedlit's ray extra "
            "(pip install 'fedlit[ray]'), or use executor local"
        )
    return None
