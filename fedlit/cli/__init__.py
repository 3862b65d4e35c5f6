"""The ``fedlit`` command.

``fedlit fit|test --config recipe.yaml``: a short LightningCLI subclass. The recipe's groups:
``model`` (a :class:`~fedlit.methods.FederatedMethod`), ``data`` (the
:class:`~fedlit.data.FederatedDataModule`), ``federation`` (:class:`FederationConfig`),
``trainer`` (settings every per-step Trainer shares; ``default_root_dir`` is the run
directory and ``logger`` adds loggers such as WandbLogger) and ``seed_everything``.

``fedlit compare --config comparison.yaml``: recipes x settings x seeds, then a report
(:mod:`fedlit.comparison`). ``fedlit report RUN_DIR...``: the results table and plots of
finished runs. ``fedlit partition --config recipe.yaml``: plot a recipe's partition.

This module imports neither torch nor Lightning: ``fedlit --help`` prints at once, and
``fedlit fit`` says what it does before the seconds those imports take. Its other names
(:class:`FedlitCLI`, :func:`resolve`, ...) are its submodules', imported when first used.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NoReturn

from fedlit.cli.paths import config_paths

if TYPE_CHECKING:
    from fedlit.cli.common import (
        CONFIG_MODE,
        FIT_GROUPS,
        config_file_error,
        json_line,
        load_config,
    )
    from fedlit.cli.compare import COMPARE_GROUPS, compare_main
    from fedlit.cli.fit import (
        EXECUTOR_GROUPS,
        FIT_HELP,
        INTERRUPTED,
        FedlitCLI,
        executor_warnings,
        interrupted,
        loggers,
        template,
        write_failure,
    )
    from fedlit.cli.partition import PARTITION_HELP, PartitionCLI, partition_main
    from fedlit.cli.report import report_main
    from fedlit.cli.test import SPLIT_FREE, TEST_HELP, run_test
    from fedlit.cli.trainer_group import LIGHTNING_ONLY, TRAINER_KEYS, without_lightning_defaults
    from fedlit.resolver import resolve

__all__ = [
    "COMMANDS",
    "COMPARE_GROUPS",
    "CONFIG_MODE",
    "EXECUTOR_GROUPS",
    "FIT_GROUPS",
    "FIT_HELP",
    "FIT_USAGE",
    "INTERRUPTED",
    "LIGHTNING_ONLY",
    "PARTITION_HELP",
    "SPLIT_FREE",
    "TEST_HELP",
    "TRAINER_KEYS",
    "USAGE",
    "FedlitCLI",
    "PartitionCLI",
    "compare_main",
    "config_file_error",
    "console_main",
    "exit_now",
    "executor_warnings",
    "interrupted",
    "json_line",
    "load_config",
    "loggers",
    "main",
    "partition_main",
    "report_main",
    "resolve",
    "run_test",
    "template",
    "without_lightning_defaults",
    "write_failure",
]

#: Where each name this package re-exports is defined: imported on first use (PEP 562).
_HOMES = {
    "fedlit.cli.common": (
        *("CONFIG_MODE", "FIT_GROUPS", "config_file_error", "json_line", "load_config"),
    ),
    "fedlit.cli.trainer_group": ("LIGHTNING_ONLY", "TRAINER_KEYS", "without_lightning_defaults"),
    "fedlit.cli.compare": ("COMPARE_GROUPS", "compare_main"),
    "fedlit.cli.fit": (
        *("EXECUTOR_GROUPS", "FIT_HELP", "INTERRUPTED", "FedlitCLI", "executor_warnings"),
        *("interrupted", "loggers", "template", "write_failure"),
    ),
    "fedlit.cli.partition": ("PARTITION_HELP", "PartitionCLI", "partition_main"),
    "fedlit.cli.report": ("report_main",),
    "fedlit.resolver": ("resolve",),
    "fedlit.cli.test": ("SPLIT_FREE", "TEST_HELP", "run_test"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME_OF[name]), name)


def _command(name: str) -> Callable[[Sequence[str]], None]:
    """A command's entry point, its module imported when it runs."""

    def run(argv: Sequence[str]) -> None:
        __getattr__(name)(argv)

    run.__name__ = run.__qualname__ = name
    return run


# ``fedlit compare`` runs ``fit`` in-process with its own arguments, by design.
warnings.filterwarnings("ignore", message=r".*LightningCLI's args parameter is intended.*")

COMMANDS = {
    "compare": _command("compare_main"),
    "report": _command("report_main"),
    "partition": _command("partition_main"),
}

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

fedlit COMMAND --help lists a command's settings; fedlit --version prints the version.
"""

#: ``fedlit fit --help``: the recipe's groups and where their settings are listed, printed
#: at once. Every setting (about 700 lines, after the seconds of importing torch and
#: Lightning): ``fedlit fit --config RECIPE --help``.
FIT_USAGE = """usage: fedlit fit --config RECIPE [--GROUP.KEY=VALUE ...]

Train a federation from a recipe (a YAML file) and dotted overrides, or continue one with
--federation.resume. The run directory is trainer.default_root_dir.

a recipe's groups, each overridden key by key (e.g. --federation.rounds=5):
  model            the method and its settings: --model=fedlit.methods.FedSEAL,
                   --model.init_args.optim.server_lr=0.01, --model.init_args.network.backbone=...
  data             the data set, the labels at the server and the clients' partition:
                   --data.dataset, --data.labeled_per_class, --data.partitioner, --data.hflip
  federation       the rounds and the clients: --federation.rounds, clients_per_round,
                   local_epochs, server_epochs, init_from, resume, executor
  trainer          the run directory, loggers (W&B), accelerator and precision:
                   --trainer.default_root_dir, --trainer.logger
  seed_everything  the seed: the partition, the sampling and the initial network

every setting with its default and help, a recipe's values filled in:
  fedlit fit --config recipes/quickstart.yaml --help
a method's own settings:
  fedlit fit --model.help FedSEAL
the resolved config, without training:
  fedlit fit --config recipes/quickstart.yaml --print_config
"""

#: The words after ``fedlit fit`` that only print (help, the resolved config): no start line.
_PRINT_ONLY = ("-h", "--help", "--print_config")


def console_main() -> None:
    """The ``fedlit`` console script and ``python -m fedlit``: :func:`main`, and a command
    stopped by SIGTERM or Ctrl-C then ends its process at once (:func:`exit_now`)."""
    try:
        main()
    except SystemExit as end:
        if "fedlit.cli.fit" in sys.modules:  # a command ran (else nothing could stop it)
            from fedlit.cli.fit import INTERRUPTED
            from fedlit.federation.fit.trainer import TERMINATED

            if end.code in (TERMINATED, INTERRUPTED):
                exit_now(end.code)
        raise


def exit_now(code: int) -> NoReturn:
    """End this process with status ``code`` once the command's own clean-up is done: the
    atexit handlers run and the output is flushed, but the interpreter's teardown (every
    module of torch and Lightning freed object by object, seconds on a busy machine) and the
    wait for other threads are skipped."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(code)


#: What each command that says so first does, in the line it starts with.
_DOING = {
    "fit": "training a federation",
    "test": "testing a checkpoint",
    "compare": "running a comparison",
}


def starting_line(argv: Sequence[str]) -> str | None:
    """The line ``fedlit fit``, ``fedlit test`` and ``fedlit compare`` print first, before the
    seconds of importing torch and Lightning: what the command does and with which recipe or
    spec; None where the command only prints (``--help``, ``--print_config``) or is another
    one."""
    if not argv or argv[0] not in _DOING:
        return None
    keys = [word.split("=", 1)[0] for word in argv[1:]]
    if any(key in _PRINT_ONLY or key.endswith(".help") for key in keys):
        return None
    configs = list(config_paths(argv))
    recipe = f" from {', '.join(configs)}" if configs else ""
    return (
        f"fedlit {argv[0]}: {_DOING[argv[0]]}{recipe}; importing torch and Lightning first "
        "(seconds to a minute on a busy machine)"
    )


def unknown_command(word: str) -> str:
    """The refusal of ``fedlit WORD`` where WORD is no command: every command named, and the
    nearest one where WORD looks like a misspelling of it."""
    import difflib

    names = ["fit", "test", *COMMANDS]
    near = difflib.get_close_matches(word, names, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"fedlit: error: {word!r} is not a command (choose from {', '.join(names)}){hint}"


def main(args: Sequence[str] | None = None) -> None:
    """The ``fedlit`` console script: ``fit``/``test`` (LightningCLI) or ``compare``,
    ``report``, ``partition``."""
    argv = list(sys.argv[1:] if args is None else args)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="", file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        from fedlit import __version__

        print(f"fedlit {__version__}")
        raise SystemExit(0)
    if argv[0] == "fit" and argv[1:] in (["-h"], ["--help"]):  # the groups, no imports
        print(FIT_USAGE, end="")
        raise SystemExit(0)
    if not argv[0].startswith("-") and argv[0] not in ("fit", "test", *COMMANDS):
        print(USAGE.splitlines()[0], file=sys.stderr)
        print(unknown_command(argv[0]), file=sys.stderr)
        raise SystemExit(2)
    line = starting_line(argv)
    # a comparison's run (it passes the run's labels): the comparison said so once
    in_comparison = any(a.startswith("--federation.labels=") for a in argv)
    if line is not None and not in_comparison:
        print(line, file=sys.stderr, flush=True)
    if argv[0] == "compare" and line is None:  # its help: the spec's settings, no imports
        COMMANDS["compare"](argv[1:])
        return
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from fedlit.cli.fit import INTERRUPTED, FedlitCLI
    from fedlit.data.own.torch_datasets import UserCodeFailed
    from fedlit.federation.fit.trainer import TERMINATED

    try:
        if argv and argv[0] in COMMANDS:
            COMMANDS[argv[0]](argv[1:])
            return
        FedlitCLI(args=argv)
    except UserCodeFailed as failed:  # the user's Dataset raised: one line, then its traceback
        print(f"fedlit: error: {failed}; its traceback:", file=sys.stderr, flush=True)
        if failed.__cause__ is not None:
            traceback.print_exception(failed.__cause__, file=sys.stderr)
        raise SystemExit(1) from None
    except SIGTERMException as stop:  # Lightning's own raise carries no status: not a success
        raise SystemExit(stop.code or TERMINATED) from None
    except KeyboardInterrupt:  # Ctrl-C outside a run's rounds
        print("fedlit: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED) from None
