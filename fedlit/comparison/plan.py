"""A comparison's runs: each one's ``fedlit fit`` arguments and directory (:func:`plan`, and
:func:`plan_sources` for the runs the others start from), and what a run directory holds
already (:func:`run_state`)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlit.comparison.spec import Comparison
from fedlit.run_layout import CHECKPOINT, METRICS_FILE, RECORD_FILE, RUN_MARKERS

ROOT_DIR_ARG = "--trainer.default_root_dir="


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison."""

    recipe: Path
    setting: str
    seed: int
    run_dir: Path
    args: tuple[str, ...]  # the ``fedlit fit`` arguments, without any resume

    @property
    def method(self) -> str:
        return self.recipe.stem

    def command(self) -> str:
        return shlex.join(["fedlit", "fit", *self.args])

    def labels_arg(self) -> str:
        """What the run's ``run.json`` names it by (``federation.labels``; the run writes
        it): its recipe's name as its method, its setting and its recipe."""
        labels = {"method": self.method, "setting": self.setting, "recipe": str(self.recipe)}
        return f"--federation.labels={json.dumps(labels)}"


INIT_FROM_ARG = "--federation.init_from="

#: The overrides that change how the clients' images are divided, not the server's data (its
#: labeled and validation sets): the partitioner and its parameters.
CLIENT_SIDE_KEYS = ("--data.partitioner",)


def _client_side(arg: str) -> bool:
    """Whether override ``arg`` (``--key=value``) sets one of :data:`CLIENT_SIDE_KEYS`."""
    key = arg.split("=", 1)[0]
    return any(key == k or key.startswith(f"{k}.") for k in CLIENT_SIDE_KEYS)


def source_settings(comparison: Comparison) -> dict[str, str]:
    """Each setting -> the setting whose source runs (``init_from``) its runs start from.

    A source whose method trains no clients (its round plan the server's step alone:
    Server-SL) reads the server's data only. Settings whose overrides differ only in
    :data:`CLIENT_SIDE_KEYS` give it the same data, so the same weights: they share the first
    such setting's source run, seed by seed. A setting whose own source folder holds a run
    already (an earlier comparison's) keeps it. Otherwise each setting has its own."""
    own = {setting: setting for setting in comparison.settings}
    source = comparison.init_from
    if source is None:
        return own
    owners: dict[tuple[str, ...], str] = {}
    for setting, overrides in comparison.settings.items():
        server_side = tuple(a for a in overrides if not _client_side(a))
        owners.setdefault(server_side, setting)
    if len(owners) == len(own):  # no two settings give the server the same data
        return own
    first = next(iter(comparison.settings))
    probe = _planned(
        comparison, Path(source.recipe), first, comparison.seeds[0], source.overrides, source.folder
    )
    if not _trains_no_clients(probe):
        return own
    shared = {}
    for setting, overrides in comparison.settings.items():
        owner = owners[tuple(a for a in overrides if not _client_side(a))]
        kept = any(
            (comparison.run_dir(setting, source.folder, seed) / marker).exists()
            for seed in comparison.seeds
            for marker in (CHECKPOINT, *RUN_MARKERS)
        )
        shared[setting] = setting if kept else owner
    return shared


def _trains_no_clients(run: PlannedRun) -> bool:
    """Whether ``run``'s method trains no clients: its round plan is the server's step alone
    (its recipe and overrides resolved, nothing run)."""
    from fedlit.resolver import resolve
    from fedlit.methods.plan import SERVER_ONLY

    return bool(resolve(run.args).model.round_plan() == SERVER_ONLY)


def source_dir(comparison: Comparison, setting: str, seed: int, owner: str | None = None) -> Path:
    """Where the run that ``setting``'s runs of ``seed`` start from is written: in ``owner``'s
    folder where ``setting`` shares its source (:func:`source_settings`)."""
    assert comparison.init_from is not None
    return comparison.run_dir(owner or setting, comparison.init_from.folder, seed)


def plan_sources(comparison: Comparison) -> list[PlannedRun]:
    """The runs the others start from (``comparison.init_from``), setting by setting, seed by
    seed, one for the settings that share it (:func:`source_settings`); none without
    ``init_from``."""
    source = comparison.init_from
    if source is None:
        return []
    owners = set(source_settings(comparison).values())
    return [
        _planned(
            comparison, Path(source.recipe), setting, seed, source.overrides, folder=source.folder
        )
        for setting in comparison.settings
        if setting in owners
        for seed in comparison.seeds
    ]


def plan(comparison: Comparison) -> list[PlannedRun]:
    """Every run of ``comparison``, setting by setting, recipe by recipe, seed by seed (each
    started from its seed's source run where ``init_from`` is given: its setting's, or the one
    its setting shares, :func:`source_settings`)."""
    owners = source_settings(comparison)
    return [
        _planned(comparison, recipe, setting, seed, owner=owners[setting])
        for setting in comparison.settings
        for recipe in map(Path, comparison.recipes)
        for seed in comparison.seeds
    ]


def _planned(
    comparison: Comparison,
    recipe: Path,
    setting: str,
    seed: int,
    own: Sequence[str] = (),
    folder: str | None = None,
    owner: str | None = None,
) -> PlannedRun:
    """The run of ``recipe`` in ``setting`` at ``seed``: the comparison's overrides, the
    setting's, then ``own`` (a source run's; ``folder``: its folder) or the recipe's own
    (``recipe_overrides``) and the warm start from the source run (``owner``'s, where the
    setting shares it), then the seed, the directory and the W&B logger."""
    run_dir = comparison.run_dir(setting, folder or recipe.stem, seed)
    warm = []
    if folder is None:
        own = comparison.recipe_overrides.get(recipe.stem, [])
        if comparison.init_from is not None:
            warm = [f"{INIT_FROM_ARG}{source_dir(comparison, setting, seed, owner)}"]
    args = [
        f"--config={recipe}",
        *comparison.overrides,
        *comparison.settings[setting],
        *own,
        *warm,
        f"--seed_everything={seed}",
        f"{ROOT_DIR_ARG}{run_dir}",
        *([] if folder else _wandb_args(comparison, setting, recipe.stem, seed, run_dir)),
    ]
    return PlannedRun(recipe, setting, seed, run_dir, tuple(args))


def _wandb_args(
    comparison: Comparison, setting: str, method: str, seed: int, run_dir: Path
) -> list[str]:
    """The run's W&B logger: in the comparison's group, its ``job_type`` the recipe's stem
    (W&B's runs table groups by it: each method's runs together), the method, setting and seed
    in its config and tags. (The comparison runs its fits with W&B's ``quiet`` setting:
    :func:`~fedlit.federation.loggers.quiet_wandb`.)"""
    if comparison.wandb is None:
        return []
    return [
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
        f"--trainer.logger.init_args.project={comparison.wandb.project}",
        f"--trainer.logger.init_args.name={comparison.name}/{setting}/{method}/seed{seed}",
        f"--trainer.logger.init_args.save_dir={run_dir}",
        f"--trainer.logger.init_args.offline={str(comparison.wandb.offline).lower()}",
        f"--trainer.logger.dict_kwargs.group={comparison.name}",
        f"--trainer.logger.dict_kwargs.job_type={method}",
        f"--trainer.logger.dict_kwargs.tags=[{method}, {setting}, seed{seed}]",
        f"--trainer.logger.dict_kwargs.config={{method: {method}, setting: {setting}}}",
    ]


def run_state(run: PlannedRun, rounds: int) -> str:
    """ "new" (nothing written), "finished", "resumable" (a checkpoint short of ``rounds``),
    "broken" (files but no checkpoint: stopped inside its first round) or "record" (a
    finished run kept as its record alone, :mod:`~fedlit.comparison.records`, that ends
    short of ``rounds``: without its checkpoint it cannot go on). A run kept as its record
    that reaches ``rounds`` is finished."""
    ckpt = run.run_dir / CHECKPOINT
    if ckpt.is_file():
        from fedlit.federation.checkpoint import checkpoint_round  # torch: with the runs only

        # the round alone, from a checkpoint of any format: a finished run written by an
        # earlier fedlit is finished; one to resume needs today's format (the resume says so)
        return "finished" if checkpoint_round(ckpt) >= rounds else "resumable"
    record = run.run_dir / RECORD_FILE
    if record.is_file():
        return "finished" if recorded_round(run.run_dir) >= rounds else "record"
    return "broken" if any((run.run_dir / m).exists() for m in RUN_MARKERS) else "new"


def recorded_round(run_dir: Path) -> int:
    """The round a run kept as its record had finished (its ``record.json``); ValueError
    naming the file where it is unreadable or its run's ``metrics.csv`` is missing."""
    path = run_dir / RECORD_FILE
    try:
        value = json.loads(path.read_text()).get("round")
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: not a run's record ({err})") from err
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: 'round' must be a round number, got {value!r}")
    if not (run_dir / METRICS_FILE).is_file():
        raise ValueError(f"{path}: the record's {METRICS_FILE} is missing beside it")
    return value
