"""``fedlit partition``: a recipe's partition plotted and summarised, no training."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from fedlit.cli.fit import FedlitCLI
from fedlit.run_layout import write_path_error

PARTITION_HELP = "Plot and summarise a recipe's partition (for its seed_everything), no training."


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
    from fedlit.federation.console import note
    from fedlit.reporting import plot_partition

    cli = PartitionCLI(args=list(argv), run=False)
    out = cli.config["out"]
    error = write_path_error(out or "", "--out", "file")
    if error:
        cli.parser.error(error)
    data = cli.datamodule
    for line in data.notes:
        note(line)
    try:
        data.setup_federation(int(cli.config["seed_everything"]))
    except ValueError as err:
        cli.parser.error(str(err))
    summary = data.partition_summary()
    title = data.partition_title()
    path = plot_partition(
        data.class_counts,
        out,
        title=title,
        class_names=data.class_names,
        client_names=data.named_clients(),
    )
    names = data.client_names()
    counts = {names[k]: row.tolist() for k, row in enumerate(data.class_counts)}
    print(json.dumps({"plot": str(path), "title": title, **summary, "class_counts": counts}))
