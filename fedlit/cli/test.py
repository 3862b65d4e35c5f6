"""``fedlit test``: a run's checkpoint evaluated on the test set of the run's own split."""

from __future__ import annotations

from typing import Any

from fedlit.cli.common import json_line
from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation import Evaluator, scored
from fedlit.federation import load_checkpoint
from fedlit.federation.checks import loading_data
from fedlit.federation.fit import TrainerTemplate
from fedlit.methods import FederatedMethod

#: Data settings that change neither the split ``fedlit test`` re-draws nor the scoring.
SPLIT_FREE = ("data.root", "data.download", "data.batch_size", "data.client_batch_size")


TEST_HELP = (
    "Evaluate a run's checkpoint on the test set: --config RUN/config.yaml "
    "--ckpt_path RUN/checkpoints/last.ckpt."
)


def run_test(
    model: FederatedMethod,
    datamodule: FederatedDataModule,
    ckpt_path: str,
    config: dict[str, Any],
    seed: int,
    trainer: TrainerTemplate,
) -> None:
    """``fedlit test``: the checkpoint's model, scored on the run's own split's test set,
    printed as one JSON line. ``config`` is the command's flat config, which must draw the
    run's split, ``seed`` its ``seed_everything``, ``trainer`` the Trainers' settings. A
    ValueError says what is wrong."""
    try:
        ckpt = load_checkpoint(ckpt_path)
        model.load_state_dict(ckpt["method_state"])
    except (ValueError, RuntimeError) as err:
        raise ValueError(f"ckpt_path: {err}") from err
    # the run's own split (its seed): the scored network's BatchNorm statistics are
    # re-estimated on the server's clean images, as every round's test/acc is
    saved = ckpt.get("hparams") or {}
    for key in sorted(k for k in saved if k == "seed_everything" or k.startswith("data.")):
        if key not in SPLIT_FREE and key in config and config[key] != saved[key]:
            raise ValueError(
                f"test: {key}={config[key]!r}, the run had {saved[key]!r}; the scored model's "
                "statistics come from the run's own server split: give the run's config "
                "(--config <run>/config.yaml)"
            )
    with loading_data(datamodule):
        datamodule.setup_federation(seed)
    network = scored(model.eval_network(), datamodule, trainer.device())
    evaluator = Evaluator(network, datamodule.num_classes)
    trainer.test(evaluator, datamodule.test_dataloader())
    result = {"ckpt_path": str(ckpt_path), "round": ckpt["round"], **evaluator.metrics()}
    print(json_line(result))
