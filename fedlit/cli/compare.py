"""``fedlit compare``: recipes x settings x seeds, then a report (:mod:`fedlit.comparison`)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

import numpy as np
from jsonargparse import ActionConfigFile

from fedlit.cli.common import CONFIG_MODE, config_file_error
from fedlit.cli.fit import resolve
from fedlit.refusals import (
    OneLineParser,
)

#: The groups of a comparison spec given as a mapping.
COMPARE_GROUPS = ("settings", "recipe_overrides", "published", "wandb", "tune", "tune.spaces")


def compare_main(argv: Sequence[str]) -> None:
    """``fedlit compare --config comparison.yaml [--seeds [0,1] ...]``."""
    from fedlit.cli import main  # each run is ``fedlit fit``, in this process
    from fedlit.comparison import Comparison, run_comparison  # needs matplotlib
    from fedlit.comparison.runner import Refused

    parser = OneLineParser(
        prog="fedlit compare", description=Comparison.__doc__, parser_mode=CONFIG_MODE
    )
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(Comparison)
    error = config_file_error(argv, COMPARE_GROUPS)
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
