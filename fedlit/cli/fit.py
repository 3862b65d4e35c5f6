"""``fedlit fit`` (and ``test``): a short LightningCLI subclass that runs a federation."""

from __future__ import annotations

import errno
import importlib.util
import math
import shlex
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from fedlit.cli.common import (
    CONFIG_MODE,
    closing_lines,
    config_file_error,
    json_line,
    not_a_group,
)
from fedlit.cli.test import TEST_HELP, run_test
from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation import Federation, FederationConfig, TrainerTemplate, load_checkpoint
from fedlit.federation.checkpoint import WRITE_FAILED, WriteFailed, write_error
from fedlit.federation.checks import check_trainer
from fedlit.federation.config import DEFAULT_POOL, DEFAULT_RAY
from fedlit.federation.console import warn
from fedlit.federation.faults import ROUND_FAILED, RoundFailed, stop_on_sigterm
from fedlit.federation.rundir import free_config_name
from fedlit.federation.trial import TrialPruned, trial_callbacks
from fedlit.machine import available_cores
from fedlit.methods import FederatedMethod
from fedlit.methods.plan import SERVER_ONLY
from fedlit.refusals import OneLineErrors, one_line
from fedlit.run_layout import MAX_SEED, flat_config, write_path_error

class OneLineLightningParser(OneLineErrors, LightningArgumentParser):
    """LightningCLI's parser whose refusals are one sentence."""


#: The exit status of a run stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED = 130


FIT_HELP = (
    "Train a federation (model, data, federation, trainer, seed_everything: a recipe and "
    "dotted overrides), or continue one with --federation.resume; writes the run directory "
    "trainer.default_root_dir."
)


def loggers(logger: Any, run_dir: Path) -> list[Logger]:
    """``trainer.logger`` as a Lightning Trainer reads it: none for False, Lightning's default
    logger in the run directory for True or None (TensorBoard where installed, else CSV), a
    logger or a list of them."""
    if logger is False:
        return []
    if logger is True or logger is None:
        if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
            return [TensorBoardLogger(save_dir=run_dir, version=SLURMEnvironment.job_id())]
        return [CSVLogger(save_dir=run_dir)]
    return list(logger) if isinstance(logger, Iterable) else [logger]


class FedlitCLI(LightningCLI):
    """LightningCLI whose ``fit`` runs a federation and whose ``test`` evaluates its checkpoint."""

    trainer: TrainerTemplate  # type: ignore[assignment]  # the per-step Trainers' settings

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            model_class=FederatedMethod,
            datamodule_class=FederatedDataModule,
            subclass_mode_model=True,
            save_config_callback=None,
            auto_configure_optimizers=False,
            seed_everything_default=0,
            parser_class=OneLineLightningParser,
            parser_kwargs={
                "fit": {"description": FIT_HELP},
                "test": {"description": TEST_HELP},
            },
            args=args,
            run=run,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {
            # a federation continues from --federation.resume, not from a Trainer checkpoint
            "fit": {
                "model",
                "train_dataloaders",
                "val_dataloaders",
                "datamodule",
                "ckpt_path",
                "weights_only",
            },
            "test": {"model", "dataloaders", "datamodule", "weights_only"},
        }

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, reading YAML as :func:`load_config` does, its usage line
        ``fedlit`` however it was started (``python -m fedlit``, in-process)."""
        kwargs.setdefault("prog", "fedlit")
        return super().init_parser(parser_mode=CONFIG_MODE, **kwargs)

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The recipe's groups: ``trainer`` (fedlit's :class:`TrainerTemplate`, the run
        directory and the loggers; no Lightning Trainer of its own), ``model`` and ``data``."""
        parser.add_class_arguments(
            TrainerTemplate, "trainer", skip={"compile"}, instantiate=False, sub_configs=True
        )
        parser.set_defaults({"trainer.devices": "auto"})  # Lightning's
        group = (parser.groups or {})["trainer"]
        group.add_argument(
            "--trainer.default_root_dir",
            type=str | None,
            default="runs/fedlit",
            help="the run directory (metrics.csv, checkpoints/, config.yaml)",
        )
        group.add_argument(
            "--trainer.logger",
            type=Logger | Iterable[Logger] | bool | None,
            default=False,
            help="loggers beside metrics.csv, e.g. lightning.pytorch.loggers.WandbLogger",
        )
        parser.add_lightning_class_args(FederatedMethod, "model", subclass_mode=True)
        parser.add_lightning_class_args(FederatedDataModule, "data")

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(FederationConfig, "federation")
        parser.link_arguments(
            "data.num_classes", "model.init_args.network.num_classes", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.in_channels", "model.init_args.network.in_channels", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.image_shape",
            "model.init_args.network.image_size",
            compute_fn=image_side,
            apply_on="instantiate",
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """LightningCLI's parsing, after a check of the config files that names the file (and
        the line) of a YAML error, and says so when a file is empty."""
        error = config_file_error(sys.argv[1:] if args is None else args)
        if error:
            parser.error(error)
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """``fedlit test --ckpt_path``: refuse a file that is not a federation checkpoint with
        a message, before anything runs. (Lightning's own step here reads a LightningModule
        checkpoint's hyperparameters, which a federation checkpoint does not have.)"""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path:
            try:
                load_checkpoint(ckpt_path)
            except ValueError as err:
                self.parser.error(f"ckpt_path: {err}")

    def _set_seed(self) -> None:
        """Lightning's seeding, after refusing a seed numpy cannot take (negative, or above
        :data:`~fedlit.run_layout.MAX_SEED`)."""
        seed = self._get(self.config, "seed_everything")
        if not isinstance(seed, bool) and isinstance(seed, int) and not 0 <= seed <= MAX_SEED:
            self.parser.error(f"seed_everything={seed}: a seed is an integer in [0, {MAX_SEED}]")
        super()._set_seed()

    def before_instantiate_classes(self) -> None:
        """Refuse a NaN or infinite value in any setting, an empty run directory, a group of
        the method's settings (:data:`MODEL_GROUPS`) that is not a mapping and ``trainer.*``
        settings a Trainer cannot train with, naming the key."""
        config = (self.config[self.subcommand] if self.subcommand else self.config).as_dict()
        root = (config.get("trainer") or {}).get("default_root_dir")
        if self.subcommand == "fit" and (root is None or not str(root).strip()):
            self.parser.error(
                f"trainer.default_root_dir={root!r}: empty; name the run's directory "
                "(e.g. runs/<name>)"
            )
        if self.subcommand == "fit":
            error = write_path_error(str(root), "trainer.default_root_dir", "run")
            if error:
                self.parser.error(error)
        for key, value in _floats(config):
            if not math.isfinite(value):
                self.parser.error(f"{key}: must be a finite number, got {value}")
        init_args = (config.get("model") or {}).get("init_args") or {}
        for group in MODEL_GROUPS:
            error = not_a_group(f"model.init_args.{group}", init_args.get(group))
            if error:
                self.parser.error(error)
        if self.subcommand in ("fit", "test"):
            try:
                check_trainer(template(config["trainer"]))
            except ValueError as err:
                self.parser.error(str(err))
        if self.subcommand == "fit":
            for line in executor_warnings(config.get("federation") or {}):
                warn(line)

    def _wandb_into_run_dir(self) -> None:
        """A ``WandbLogger`` whose ``save_dir`` is left at its default (``.``, the current
        directory) and has no ``dir`` writes its files (an offline run) into the run
        directory, ``<run>/wandb/``, as the comparison's runs do. The path is made absolute:
        W&B's service process, started once per Python process, may have another current
        directory (a notebook that changed it)."""
        trainer = (self.config[self.subcommand] if self.subcommand else self.config).trainer
        loggers = trainer.logger if isinstance(trainer.logger, list) else [trainer.logger]
        for logger in loggers:
            path = str(getattr(logger, "class_path", ""))
            args = getattr(logger, "init_args", None)
            if (
                path.endswith("WandbLogger")
                and args is not None
                and str(args.get("save_dir", ".")) == "."
                and not args.get("dir")
            ):
                args.save_dir = str(Path(trainer.default_root_dir).absolute())

    def instantiate_classes(self) -> None:
        """LightningCLI's, with a W&B run's files in the run directory and a refusal printed
        as one sentence: the ValueError of fedlit's validation, its key in full
        (:func:`~fedlit.refusals.one_line`)."""
        self._wandb_into_run_dir()
        config = self.config[self.subcommand] if self.subcommand else self.config
        network = config.model.init_args.get("network") or {}
        given = {key: network.get(key) for key in LINKED_FROM_DATA}
        try:
            super().instantiate_classes()
        except ValueError as err:
            self.parser.error(one_line(str(err), err, flat_config(config.as_dict(), groups=True)))
        contradiction = linked_contradiction(given, self.datamodule)
        if contradiction:
            self.parser.error(contradiction)

    def instantiate_trainer(self, **_: Any) -> TrainerTemplate:  # type: ignore[override]
        """The per-step Trainers' settings: fedlit builds no Trainer for the run itself."""
        return template(self._get(self.config_init, "trainer"))

    # --- helpers -------------------------------------------------------------------------------
    def flat_config(self) -> dict[str, Any]:
        """The subcommand's config as ``hparams.yaml`` holds it (dotted keys), without the
        ``--config`` files' names, with the clients' number and size the data set decided
        (``data.num_clients`` left unset, or client folders): what a resume compares."""
        config = self.config[self.subcommand] if self.subcommand else self.config  # resolve's
        flat = flat_config(config.clone().as_dict())
        flat.pop("config", None)
        data = getattr(self, "datamodule", None)
        if isinstance(data, FederatedDataModule):
            flat["data.num_clients"] = data.num_clients
            flat["data.examples_per_client"] = data.examples_per_client
        return flat

    # --- subcommands -------------------------------------------------------------------------
    def test(
        self,
        model: FederatedMethod,
        datamodule: FederatedDataModule,
        ckpt_path: str | None = None,
        **_: Any,
    ) -> None:
        if not ckpt_path:
            self.parser.error("test: --ckpt_path <run>/checkpoints/last.ckpt is required")
        try:
            run_test(
                model,
                datamodule,
                ckpt_path,
                self.flat_config(),
                int(self.config[self.subcommand].seed_everything),
                self.trainer,
            )
        except ValueError as err:
            self.parser.error(str(err))

    def fit(self, model: FederatedMethod, datamodule: FederatedDataModule, **_: Any) -> None:
        with stop_on_sigterm():  # from the checks on, a SIGTERM exits with 143 cleanly
            self._fit(model, datamodule)

    def _fit(self, model: FederatedMethod, datamodule: FederatedDataModule) -> None:
        config, init = self.config[self.subcommand], self.config_init[self.subcommand]
        run_dir = Path(config.trainer.default_root_dir)
        federation = Federation(
            method=model,
            data=datamodule,
            config=init.federation,
            run_dir=run_dir,
            seed=int(config.seed_everything),
            trainer=self.trainer,
            loggers=loggers(init.trainer.logger, run_dir),
            hparams=self.flat_config(),
            extra_callbacks=trial_callbacks(init.federation.labels),  # a tuning study's trial
        )
        try:
            federation.prepare()
            federation.open_run_dir()  # locked from here to the end of the run
        except ValueError as err:
            federation.close()  # a Ray the checks started stops too
            self.parser.error(str(err))
        run_dir = federation.run_dir
        name = free_config_name(run_dir, federation.start_round)
        try:
            self._parser(self.subcommand).save(
                config, run_dir / name, skip_none=False, overwrite=False, multifile=False
            )
            result = federation.run()
        except RoundFailed as err:  # a failed round, not a bad setting: its own status
            print(f"fedlit fit: error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(ROUND_FAILED) from None
        except OSError as err:  # a full disk: one line, the last checkpoint kept
            failed = write_failure(err)
            if failed is None:
                raise
            print(f"fedlit fit: error: {failed}", file=sys.stderr, flush=True)
            raise SystemExit(WRITE_FAILED) from None
        except TrialPruned as pruned:  # its study stopped it: done, as the study wants
            print(json_line({"run_dir": str(run_dir), "pruned": str(pruned)}))
            return
        except KeyboardInterrupt:
            print(interrupted(federation, run_dir / name), file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED) from None
        finally:
            federation.close()
        print(json_line({"run_dir": str(run_dir), **result.final}), flush=True)
        # a comparison's run (its labels name its setting): the comparison has its baseline
        in_comparison = "setting" in (federation.config.labels or {})
        trains_clients = model.round_plan() != SERVER_ONLY and not in_comparison
        for line in closing_lines(result.history, run_dir, trains_clients):
            print(line, file=sys.stderr, flush=True)


#: Each executor's own settings group: given with another executor, it is not used.
EXECUTOR_GROUPS: dict[str, Any] = {"pool": DEFAULT_POOL, "ray": DEFAULT_RAY}


def executor_warnings(federation: dict[str, Any], cores: int | None = None) -> list[str]:
    """Lines warning of settings of a ``federation`` group (a dict) that do not apply as given:
    ``federation.pool.*`` or ``federation.ray.*`` set for another executor (unused), and
    ``federation.pool.threads`` or ``federation.pool.workers`` above this machine's ``cores``
    (default: those this process may run on)."""
    executor = federation.get("executor", "local")
    lines = []
    for group, default in EXECUTOR_GROUPS.items():
        given = federation.get(group) or {}
        changed = [
            f"federation.{group}.{f.name}={given[f.name]!r}"
            for f in fields(default)
            if f.name in given and given[f.name] != getattr(default, f.name)
        ]
        if changed and executor != group:
            lines.append(
                f"{', '.join(changed)}: not used, federation.executor is {executor!r} "
                f"(these settings are the {group} executor's)"
            )
    pool = federation.get("pool") or {}
    threads = pool.get("threads", DEFAULT_POOL.threads)
    workers = pool.get("workers", DEFAULT_POOL.workers)
    cores = available_cores() if cores is None else cores
    if executor == "pool" and isinstance(threads, int) and threads > cores:
        lines.append(
            f"federation.pool.threads={threads} exceeds the {cores} CPU core(s) this process "
            "may use: each worker's threads wait on each other (a round may take many times "
            f"longer); give at most {cores}"
        )
    if executor == "pool" and isinstance(workers, int) and workers > cores:
        lines.append(
            f"federation.pool.workers={workers} exceeds the {cores} CPU core(s) this process "
            "may use: the workers take turns on the cores (and each holds the run's data and "
            f"networks); give at most {cores}"
        )
    return lines


#: The method's groups of settings (``model.init_args.<group>``), each a mapping.
MODEL_GROUPS = ("network", "optim", "loss")

#: The model's settings that are the data set's: the data module's attribute each is linked
#: from, and what its value counts.
LINKED_FROM_DATA = {
    "num_classes": ("num_classes", "classes"),
    "in_channels": ("in_channels", "channels"),
    "image_size": ("image_shape", "pixels a side"),
}


def image_side(shape: tuple[int, int, int]) -> int:
    """The side of the data's images (C, H, W), the model's ``image_size``."""
    return shape[-1]


def linked_contradiction(given: dict[str, Any], data: FederatedDataModule) -> str | None:
    """The refusal of a ``model.init_args.network`` setting that the data set's own value replaces
    (``num_classes``, ``in_channels``, ``image_size``) given with another value, or None."""
    for key, (attribute, unit) in LINKED_FROM_DATA.items():
        value = given.get(key)
        if value is None:
            continue
        own = getattr(data, attribute)
        own = image_side(own) if key == "image_size" else own
        if value != own:
            return (
                f"model.init_args.network.{key}={value}: data.dataset={data.dataset!r} has "
                f"{own} {unit}; model.init_args.network.{key} is set from the data, leave it out"
            )
    return None


def template(trainer: Any) -> TrainerTemplate:
    """The per-step Trainers' settings of a parsed ``trainer`` group (a dict or Namespace)."""
    return TrainerTemplate(
        **{f.name: trainer[f.name] for f in fields(TrainerTemplate) if f.name in trainer}
    )


def write_failure(err: OSError) -> str | None:
    """The one line a failed write of the run's files ends a run with (naming the file and
    the free space), or None if ``err`` is not a failed write."""
    if isinstance(err, WriteFailed):
        return str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT) and err.filename:
        return str(WriteFailed(Path(err.filename), write_error(err) or str(err)))
    return None


def interrupted(federation: Federation, config: Path) -> str:
    """What a run stopped by Ctrl-C kept, and the command that continues it."""
    done, ckpt = federation.checkpointer.round, federation.checkpoint_path
    head = f"fedlit fit: interrupted in round {done + 1} of {federation.config.rounds}"
    if done == 0 or not ckpt.is_file():
        return (
            f"{head}, before the run's first checkpoint: nothing to resume. This starts it "
            f"afresh in {federation.run_dir}:\n  "
            + shlex.join(["fedlit", "fit", "--config", str(config)])
        )
    return (
        f"{head}. Kept: round {done}'s checkpoint, {ckpt}, and metrics.csv up to round {done}. "
        "Continue with:\n  "
        + shlex.join(["fedlit", "fit", "--config", str(config), "--federation.resume", str(ckpt)])
    )


def _floats(value: Any, key: str = "") -> Iterator[tuple[str, float]]:
    """Every float in a nested config, with its dotted key (list items as ``key[i]``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _floats(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _floats(v, f"{key}[{i}]")
    elif isinstance(value, float):
        yield key, value


def federation_of(cli: FedlitCLI, run_dir: Path | None = None, **settings: Any) -> Federation:
    """The federation a resolved recipe (:func:`~fedlit.resolver.resolve`) describes, in
    ``run_dir`` (None: its ``trainer.default_root_dir``), not prepared; ``settings``: the
    :class:`Federation`'s other fields (loggers, extra callbacks, progress)."""
    config = cli.config
    return Federation(
        method=cli.model,
        data=cli.datamodule,
        config=cli.config_init.federation,
        run_dir=Path(run_dir if run_dir is not None else config.trainer.default_root_dir),
        seed=int(config.seed_everything),
        trainer=cli.trainer,
        **settings,
    )
