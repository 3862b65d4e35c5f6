"""The ``fedlit`` command.

``fedlit fit|test --config recipe.yaml``: a short LightningCLI subclass. The recipe's groups:
``model`` (a :class:`~fedlit.methods.FederatedMethod`), ``data`` (the
:class:`~fedlit.data.FederatedDataModule`), ``federation`` (:class:`FederationConfig`),
``trainer`` (settings every per-step Trainer shares; ``default_root_dir`` is the run
directory and ``logger`` adds loggers such as WandbLogger) and ``seed_everything``.

``fedlit compare --config comparison.yaml``: recipes x settings x seeds, then a report
(:mod:`fedlit.comparison`). ``fedlit report RUN_DIR...``: the results table and plots of
finished runs. ``fedlit partition --config recipe.yaml``: plot a recipe's partition.
"""

from __future__ import annotations

import errno
import importlib.util
import inspect
import json
import math
import shlex
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from jsonargparse import ActionConfigFile, get_loader, set_loader
from lightning import Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation import Evaluator, scored
from fedlit.federation import Federation, FederationConfig, TrainerTemplate, load_checkpoint
from fedlit.federation.checkpoint import WRITE_FAILED, WriteFailed, write_error
from fedlit.federation.checks import loading_data
from fedlit.federation.faults import ROUND_FAILED, RoundFailed
from fedlit.federation.rundir import free_config_name
from fedlit.federation.trainers import TERMINATED, stop_on_sigterm
from fedlit.methods import FederatedMethod
from fedlit.refusals import OneLineLightningParser, OneLineParser, flat_keys, one_line
from fedlit.run_layout import MAX_SEED, output_dir_error

#: The ``trainer`` group's keys: the per-step Trainers' settings, the run directory, the loggers.
TRAINER_KEYS = (
    *(f.name for f in fields(TrainerTemplate) if f.name != "compile"),
    "default_root_dir",
    "logger",
)
#: ``lightning.Trainer``'s other arguments and their defaults: a run directory's config.yaml
#: written before fedlit had a ``trainer`` group of its own lists them all.
LIGHTNING_ONLY = {
    name: parameter.default
    for name, parameter in inspect.signature(Trainer.__init__).parameters.items()
    if name != "self" and name not in TRAINER_KEYS
}
#: The parser mode of fedlit's parsers: YAML, with a config's ``trainer`` group read tolerantly
#: (:func:`without_lightning_defaults`).
CONFIG_MODE = "fedlit_yaml"


#: The exit status of a run stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED = 130

#: Data settings that change neither the split ``fedlit test`` re-draws nor the scoring.
SPLIT_FREE = ("data.root", "data.download", "data.batch_size", "data.client_batch_size")


FIT_HELP = (
    "Train a federation (model, data, federation, trainer, seed_everything: a recipe and "
    "dotted overrides), or continue one with --federation.resume; writes the run directory "
    "trainer.default_root_dir."
)
TEST_HELP = (
    "Evaluate a run's checkpoint on the test set: --config RUN/config.yaml "
    "--ckpt_path RUN/checkpoints/last.ckpt."
)
PARTITION_HELP = "Plot and summarise a recipe's partition (for its seed_everything), no training."


def without_lightning_defaults(trainer: dict[str, Any]) -> dict[str, Any]:
    """A config's ``trainer`` group without the ``lightning.Trainer`` arguments fedlit never
    applied (:data:`LIGHTNING_ONLY`) that hold Lightning's default, as a run directory's
    config.yaml of an earlier fedlit lists them. Raises ValueError naming one that holds
    another value."""
    for key, value in trainer.items():
        if key in LIGHTNING_ONLY and value != LIGHTNING_ONLY[key]:
            raise ValueError(
                f"trainer.{key}={value!r}: a Lightning Trainer setting fedlit never applied "
                "(it builds a Trainer per server and client step: lengths are "
                "federation.rounds, federation.local_epochs, federation.server_epochs; logging "
                "and checkpoints are the federation's); remove it. trainer keys: "
                + ", ".join(TRAINER_KEYS)
            )
    return {k: v for k, v in trainer.items() if k not in LIGHTNING_ONLY}


def load_config(text: str) -> Any:
    """jsonargparse's YAML loader, a config's ``trainer`` group read tolerantly
    (:func:`without_lightning_defaults`)."""
    value = get_loader("yaml")(text)
    if isinstance(value, dict) and isinstance(value.get("trainer"), dict):
        value["trainer"] = without_lightning_defaults(value["trainer"])
    return value


set_loader(CONFIG_MODE, load_config, exceptions=(yaml.YAMLError, ValueError))


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
        """LightningCLI's parser, reading YAML as :func:`load_config` does."""
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
            "data.num_classes", "model.init_args.num_classes", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.in_channels", "model.init_args.in_channels", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.image_shape",
            "model.init_args.image_size",
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
        """Refuse a NaN or infinite value in any setting, an empty run directory and
        ``trainer.*`` settings a Trainer cannot train with, naming the key."""
        config = (self.config[self.subcommand] if self.subcommand else self.config).as_dict()
        root = (config.get("trainer") or {}).get("default_root_dir")
        if self.subcommand == "fit" and (root is None or not str(root).strip()):
            self.parser.error(
                f"trainer.default_root_dir={root!r}: empty; name the run's directory "
                "(e.g. runs/<name>)"
            )
        for key, value in _floats(config):
            if not math.isfinite(value):
                self.parser.error(f"{key}: must be a finite number, got {value}")
        if self.subcommand in ("fit", "test"):
            try:
                template(config["trainer"]).check()
            except ValueError as err:
                self.parser.error(str(err))

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
        given = {key: config.model.init_args.get(key) for key in LINKED_FROM_DATA}
        try:
            super().instantiate_classes()
        except ValueError as err:
            self.parser.error(one_line(str(err), err, flat_keys(config.as_dict())))
        contradiction = linked_contradiction(given, self.datamodule)
        if contradiction:
            self.parser.error(contradiction)

    def instantiate_trainer(self, **_: Any) -> TrainerTemplate:  # type: ignore[override]
        """The per-step Trainers' settings: fedlit builds no Trainer for the run itself."""
        return template(self._get(self.config_init, "trainer"))

    # --- helpers -------------------------------------------------------------------------------
    def _flat_config(self) -> dict[str, Any]:
        flat: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            elif value is None or isinstance(value, (bool, int, float, str)):
                flat[prefix] = value
            else:
                flat[prefix] = str(value)

        walk("", self.config[self.subcommand].clone().as_dict())
        flat.pop("config", None)
        return flat

    # --- subcommands -------------------------------------------------------------------------
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
            hparams=self._flat_config(),
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
        except KeyboardInterrupt:
            print(interrupted(federation, run_dir / name), file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED) from None
        finally:
            federation.close()
        print(json_line({"run_dir": str(run_dir), **result.final}))

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
            ckpt = load_checkpoint(ckpt_path)
            model.load_state_dict(ckpt["method_state"])
        except (ValueError, RuntimeError) as err:
            self.parser.error(f"ckpt_path: {err}")
        # the run's own split (its seed): the scored network's BatchNorm statistics are
        # re-estimated on the server's clean images, as every round's test/acc is
        saved, flat = ckpt.get("hparams") or {}, self._flat_config()
        for key in sorted(k for k in saved if k == "seed_everything" or k.startswith("data.")):
            if key not in SPLIT_FREE and key in flat and flat[key] != saved[key]:
                self.parser.error(
                    f"test: {key}={flat[key]!r}, the run had {saved[key]!r}; the scored model's "
                    "statistics come from the run's own server split: give the run's config "
                    "(--config <run>/config.yaml)"
                )
        try:
            with loading_data(datamodule):
                datamodule.setup_federation(int(self.config[self.subcommand].seed_everything))
        except ValueError as err:
            self.parser.error(str(err))
        network = scored(model.eval_network(), datamodule, self.trainer.device())
        evaluator = Evaluator(network, datamodule.num_classes)
        self.trainer.test(evaluator, datamodule.test_dataloader())
        result = {"ckpt_path": str(ckpt_path), "round": ckpt["round"], **evaluator.metrics()}
        print(json_line(result))


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
    """The refusal of a ``model.init_args`` setting that the data set's own value replaces
    (``num_classes``, ``in_channels``, ``image_size``) given with another value, or None."""
    for key, (attribute, unit) in LINKED_FROM_DATA.items():
        value = given.get(key)
        if value is None:
            continue
        own = getattr(data, attribute)
        own = image_side(own) if key == "image_size" else own
        if value != own:
            return (
                f"model.init_args.{key}={value}: data.dataset={data.dataset!r} has {own} "
                f"{unit}; model.init_args.{key} is set from the data, leave it out"
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


def json_line(values: dict[str, Any]) -> str:
    """``values`` as one line of strict JSON: a NaN or infinite number (a diagnostic such as
    ``diag/weight_diversity`` that could not be computed) is written as ``null``."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(values), allow_nan=False)


def interrupted(federation: Federation, config: Path) -> str:
    """What a run stopped by Ctrl-C kept, and the command that continues it."""
    done, ckpt = federation.checkpointed_round, federation.checkpoint_path
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


def _config_paths(argv: Sequence[str]) -> Iterator[str]:
    """The files given with ``--config``/``-c`` (``--config X`` or ``--config=X``)."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            yield argv[i + 1]
        elif arg.startswith("--config="):
            yield arg.split("=", 1)[1]


def config_file_error(argv: Sequence[str]) -> str | None:
    """What is wrong with a config file named in ``argv`` (a YAML error with its file and line,
    an empty file, a file that is not a mapping of settings), or None. Names that are not
    files are left to the parser."""
    for name in _config_paths(argv):
        path = Path(name)
        if not path.is_file():
            continue
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError) as err:
            return f"--config {path}: cannot read it: {err}"
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err)
            return f"--config {path}{where}: not valid YAML ({problem})"
        if loaded is None:
            return f"--config {path}: the file is empty (expected a YAML mapping of settings)"
        if not isinstance(loaded, dict):
            return (
                f"--config {path}: expected a YAML mapping of settings, "
                f"got a {type(loaded).__name__}"
            )
    return None


def resolve(args: Sequence[str]) -> FedlitCLI:
    """A recipe and its overrides (``fit``'s arguments), parsed and instantiated, not run."""
    return FedlitCLI(args=list(args), run=False)


def compare_main(argv: Sequence[str]) -> None:
    """``fedlit compare --config comparison.yaml [--seeds [0,1] ...]``."""
    from fedlit.comparison import Comparison, run_comparison  # needs matplotlib
    from fedlit.comparison.runner import Refused

    parser = OneLineParser(prog="fedlit compare", description=Comparison.__doc__)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(Comparison)
    error = config_file_error(argv)
    if error:
        parser.error(error)
    cfg = parser.parse_args(list(argv))
    cfg.pop("config")
    try:
        comparison = Comparison(**vars(parser.instantiate_classes(cfg)))
    except ValueError as err:
        parser.error(str(err))

    def rounds(args: Sequence[str]) -> int:
        return int(resolve(args).config["federation"]["rounds"])

    def partition(args: Sequence[str], seed: int) -> np.ndarray:
        data = resolve(args).datamodule
        data.setup_federation(seed)
        return data.class_counts

    command = shlex.join(["fedlit", "compare", *argv])
    try:
        written = run_comparison(comparison, command, main, rounds, partition)
    except Refused as err:  # a run directory a live fit is writing
        parser.error(str(err))
    print(json.dumps({k: str(v) for k, v in written.items()}))


def report_main(argv: Sequence[str]) -> None:
    """``fedlit report RUN_OR_FOLDER... [--target 0.8] [--baseline M] [--last_k K] [--out DIR]
    [--title T]``."""
    from fedlit.comparison.report import write_report
    from fedlit.reporting import find_runs, summarize

    parser = OneLineParser(prog="fedlit report", description="Results table and plots of runs.")
    parser.add_argument("paths", nargs="+", type=str, help="run directories or folders of runs")
    parser.add_argument("--target", type=float | None, default=None)
    parser.add_argument("--baseline", type=str | None, default=None, help="method to compare with")
    parser.add_argument("--last_k", type=int, default=1, help="score: mean of the last K rounds")
    parser.add_argument("--out", type=str, default="report")
    parser.add_argument("--title", type=str, default="fedlit runs")
    cfg = parser.parse_args(list(argv))
    error = output_dir_error(cfg.out, "--out")
    if error:
        parser.error(error)
    try:
        runs = find_runs(cfg.paths)
        # a bad baseline or last_k fails before anything is written
        summarize(runs, baseline=cfg.baseline, last_k=cfg.last_k)
    except ValueError as err:
        parser.error(str(err))
    written = write_report(
        runs, cfg.out, cfg.title, target=cfg.target, baseline=cfg.baseline, last_k=cfg.last_k
    )
    print(json.dumps({k: str(v) for k, v in written.items()}))


class PartitionCLI(FedlitCLI):
    """``fedlit partition``'s parser: a recipe, its overrides and ``--out``."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        return super().init_parser(prog="fedlit partition", description=PARTITION_HELP, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--out", type=str, default="partition.png", help="the plot's file")


def partition_main(argv: Sequence[str]) -> None:
    """``fedlit partition --config recipe.yaml [overrides] [--out partition.png]``: the
    recipe's partition (for its ``seed_everything``), plotted and summarised, no training."""
    from fedlit.reporting import plot_partition

    cli = PartitionCLI(args=list(argv), run=False)
    out = cli.config["out"]
    if not out or Path(out).is_dir():
        what = "a folder" if out else "empty"
        error: str | None = f"--out={out!r}: {what}; name the plot's file (e.g. partition.png)"
    else:
        error = output_dir_error(Path(out).parent, "--out", out)
    if error:
        cli.parser.error(error)
    data = cli.datamodule
    try:
        data.setup_federation(int(cli.config["seed_everything"]))
    except ValueError as err:
        cli.parser.error(str(err))
    summary = data.partition_summary()
    title = f"{data.dataset}, {type(data.partitioner).__name__}: R = {data.non_iid_R:.3f}"
    path = plot_partition(data.class_counts, out, title=title, class_names=data.class_names)
    counts = {f"client {k}": row.tolist() for k, row in enumerate(data.class_counts)}
    print(json.dumps({"plot": str(path), **summary, "class_counts": counts}))


# ``fedlit compare`` runs ``fit`` in-process with its own arguments, by design.
warnings.filterwarnings("ignore", message=r".*LightningCLI's args parameter is intended.*")

COMMANDS = {"compare": compare_main, "report": report_main, "partition": partition_main}

#: ``fedlit``, ``fedlit -h``, ``fedlit --help``: the commands, a line each.
USAGE = """usage: fedlit {fit,test,compare,report,partition} ...

Federated semi-supervised learning with labels at the server.

commands:
  fit        train a federation from a recipe, or continue one:
               fedlit fit --config recipes/quickstart.yaml
  test       evaluate a run's checkpoint on the test set:
               fedlit test --config RUN/config.yaml --ckpt_path RUN/checkpoints/last.ckpt
  compare    recipes x settings x seeds (resumable), then the results table and plots:
               fedlit compare --config comparison.yaml
  report     the results table and plots of finished runs:
               fedlit report RUN_OR_FOLDER... [--baseline METHOD] [--out DIR]
  partition  plot and summarise a recipe's partition, without training:
               fedlit partition --config recipe.yaml [--out partition.png]

fedlit COMMAND --help lists a command's settings.
"""


def main(args: Sequence[str] | None = None) -> None:
    """The ``fedlit`` console script: ``fit``/``test`` (LightningCLI) or ``compare``,
    ``report``, ``partition``."""
    argv = list(sys.argv[1:] if args is None else args)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="", file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    try:
        if argv and argv[0] in COMMANDS:
            COMMANDS[argv[0]](argv[1:])
            return
        FedlitCLI(args=argv)
    except SIGTERMException as stop:  # Lightning's own raise carries no status: not a success
        raise SystemExit(stop.code or TERMINATED) from None
    except KeyboardInterrupt:  # Ctrl-C outside a run's rounds
        print("fedlit: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED) from None


if __name__ == "__main__":
    main()
