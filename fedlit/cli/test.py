"""``fedlit test``: a run's checkpoint evaluated on the test set of the run's own split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlit.cli.common import json_line
from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation import Evaluator, scored
from fedlit.federation import load_checkpoint
from fedlit.federation.checks import loading_data
from fedlit.methods import FederatedMethod

if TYPE_CHECKING:
    from fedlit.cli.fit import FedlitCLI


#: Data settings that change neither the split ``fedlit test`` re-draws nor the scoring.
SPLIT_FREE = ("data.root", "data.download", "data.batch_size", "data.client_batch_size")


TEST_HELP = (
    "Evaluate a run's checkpoint on the test set: --config RUN/config.yaml "
    "--ckpt_path RUN/checkpoints/last.ckpt."
)


def run_test(
    cli: FedlitCLI,
    model: FederatedMethod,
    datamodule: FederatedDataModule,
    ckpt_path: str | None = None,
) -> None:
    """``fedlit test``: the checkpoint's model, scored on the run's own split's test set."""
    if not ckpt_path:
        cli.parser.error("test: --ckpt_path <run>/checkpoints/last.ckpt is required")
    try:
        ckpt = load_checkpoint(ckpt_path)
        model.load_state_dict(ckpt["method_state"])
    except (ValueError, RuntimeError) as err:
        cli.parser.error(f"ckpt_path: {err}")
    # the run's own split (its seed): the scored network's BatchNorm statistics are
    # re-estimated on the server's clean images, as every round's test/acc is
    saved, flat = ckpt.get("hparams") or {}, cli._flat_config()
    for key in sorted(k for k in saved if k == "seed_everything" or k.startswith("data.")):
        if key not in SPLIT_FREE and key in flat and flat[key] != saved[key]:
            cli.parser.error(
                f"test: {key}={flat[key]!r}, the run had {saved[key]!r}; the scored model's "
                "statistics come from the run's own server split: give the run's config "
                "(--config <run>/config.yaml)"
            )
    try:
        with loading_data(datamodule):
            datamodule.setup_federation(int(cli.config[cli.subcommand].seed_everything))
    except ValueError as err:
        cli.parser.error(str(err))
    network = scored(model.eval_network(), datamodule, cli.trainer.device())
    evaluator = Evaluator(network, datamodule.num_classes)
    cli.trainer.test(evaluator, datamodule.test_dataloader())
    result = {"ckpt_path": str(ckpt_path), "round": ckpt["round"], **evaluator.metrics()}
    print(json_line(result))
