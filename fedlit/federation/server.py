"""The server's side of a run: its training steps, the bootstrap before round 1, the
evaluations, and the guards that stop a run whose round failed (too few clients left, or a
global model that is no longer finite) before the round is written."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation import Evaluator, evaluate_encoder, scored
from fedlit.federation.checks import check_batches, check_optimizers
from fedlit.federation.config import FederationConfig
from fedlit.federation.faults import ClientFault, RoundFailed, name_list, nonfinite_tensors
from fedlit.federation.fit import TrainerTemplate
from fedlit.federation.seeding import CENTRAL, EVAL, FINETUNE, SERVER, derive_seed, seed_all
from fedlit.methods.base import FederatedMethod
from fedlit.methods.client_side import ClientUpdate
from fedlit.methods.plan import CentralTraining, Step
from fedlit.run_layout import VAL_CORRECT_FILE


def client_steps_per_round(config: FederationConfig, data: FederatedDataModule) -> int:
    """The optimiser steps a round's clients take together: ``clients_per_round`` x
    ``local_steps``, or ``clients_per_round`` x ``local_epochs`` x the mean number of batches
    of a client's shard (of ``data.client_batch_size``; the exact count where the shards are
    of one size), rounded."""
    per_client: float
    if config.local_steps is not None:
        per_client = config.local_steps
    else:
        batches = [len(data.client_data(k).dataloader(("weak",))) for k in range(data.num_clients)]
        per_client = config.local_epochs * sum(batches) / len(batches)
    return max(1, round(config.clients_per_round * per_client))


@dataclass
class Server:
    """The server of a run of ``method`` on ``data``: trains with ``trainer``, seeds each step
    from the run's ``seed``, and names ``checkpoint_path`` (the last good round's) when a
    guard stops the run."""

    method: FederatedMethod
    data: FederatedDataModule
    config: FederationConfig
    trainer: TrainerTemplate
    seed: int
    checkpoint_path: Path

    def __post_init__(self) -> None:
        check_batches(self.trainer, self.data)  # before any fit, nothing written yet
        if self.config.val_only and not len(self.data.val):
            raise ValueError(
                "federation.val_only: the run has no validation set to evaluate "
                "(data.val_per_class=0)"
            )
        check_optimizers(self.method, self.data, self.config.rounds)

    def server_step(
        self, round_idx: int, epochs: int | None = None, stage: str = "server"
    ) -> dict[str, float]:
        """The server's objective for ``epochs`` (``server_epochs``), logged as ``<stage>/*``
        (``finetune``: a second step in the round, after aggregation, on its own seed)."""
        if self.data.labels_at == "client":  # no labels at the server: nothing to train
            return {}
        objective = self.method.server_objective()
        if objective is None:
            return {}
        seed_all(derive_seed(self.seed, round_idx, FINETUNE if stage == "finetune" else SERVER))
        loader = self.method.server_loader(self.data)
        metrics = self.trainer.fit(objective, loader, epochs or self.config.server_epochs)
        self.method.server_step_done(objective, self.data, self.trainer.device())
        self.check_finite(round_idx, f"the {stage} step")
        return {f"{stage}/{k}": v for k, v in metrics.items()}

    def central_step(self, round_idx: int) -> dict[str, float]:
        """The plan's centralized step (:attr:`~fedlit.methods.plan.Step.CENTRAL`): the method's
        ``central_objective`` on ``central_loader`` (every client's images at the server) for
        :func:`client_steps_per_round` steps, on a seed of its own; logged as ``central/*``
        with ``central/steps``."""
        method = self.method
        if not isinstance(method, CentralTraining):
            raise TypeError(
                f"{type(method).__name__}'s plan has a centralized step, and it defines no "
                "central_objective and central_loader (fedlit.methods.plan.CentralTraining)"
            )
        objective = method.central_objective()
        steps = client_steps_per_round(self.config, self.data)
        seed_all(derive_seed(self.seed, round_idx, CENTRAL))
        fitted = self.trainer.fit(objective, method.central_loader(self.data), 1, max_steps=steps)
        self.check_finite(round_idx, "the centralized step")
        metrics = {f"central/{k}": v for k, v in fitted.items()}
        return metrics | {"central/steps": float(steps)}

    def bootstrap(self) -> dict[str, float]:
        """The plan's bootstrap (FedSEAL): the server objective for its ``bootstrap_epochs``
        before round 1, logged in row 0 as ``bootstrap/*`` with w^0's ``bootstrap_test/acc``.
        A warm-started run (``federation.init_from``) has none: its source is its w^0."""
        epochs = self.bootstrap_epochs()
        if epochs == 0:
            return {}
        self.method.on_round_start(0, self.config.rounds)
        trained = self.server_step(0, epochs)
        metrics = {k.replace("server/", "bootstrap/", 1): v for k, v in trained.items()}
        return metrics | self.evaluate("bootstrap_test")

    def bootstrap_epochs(self) -> int:
        """The server epochs :meth:`bootstrap` trains: the plan's, or 0 where it has none
        (labels at the clients, or a warm start)."""
        epochs = self.method.round_plan().bootstrap_epochs
        if self.data.labels_at == "client" or self.config.init_from is not None:
            return 0
        return epochs

    def budget(self) -> dict[str, Any]:
        """The server's training budget as ``run.json`` records it
        (:data:`~fedlit.run_layout.BUDGET_KEY`, written by the run's
        :class:`~fedlit.federation.callbacks.RunFile`): ``epochs_per_step``
        (``federation.server_epochs``, each time the server trains in a round),
        ``bootstrap_epochs`` (:meth:`bootstrap_epochs`), ``batches_per_epoch`` (the server
        loader's batches; None where it has no length), ``steps_per_round`` (the plan's steps
        that train the server's objective on its labels: ``server``, ``finetune``).
        The comparing page's definition of the budget counts all of them
        (docs/comparing.md)."""
        plan = self.method.round_plan().steps
        trains = [s.value for s in plan if s in (Step.SERVER, Step.FINETUNE)]
        batches: int | None = 0
        if self.data.labels_at != "client" and trains:
            try:
                batches = len(self.method.server_loader(self.data))
            except (TypeError, RuntimeError):  # a loader without a length
                batches = None
        return {
            "epochs_per_step": self.config.server_epochs,
            "bootstrap_epochs": self.bootstrap_epochs(),
            "batches_per_epoch": batches,
            "steps_per_round": trains if self.data.labels_at != "client" else [],
        }

    def evaluate(self, prefix: str = "test", round_idx: int | None = None) -> dict[str, float]:
        """Top-1 accuracy and loss of the method's evaluation network on the test set, its
        BatchNorm statistics re-estimated on the server's clean images (:func:`scored`); with
        ``prefix`` "test", also on the server's validation split (``val/acc``, ``val/loss``)
        where it has images (``data.val_per_class``): what a model is selected by. With
        ``federation.val_only``, the validation split alone (nothing for another ``prefix``),
        its images' correctness recorded for round ``round_idx``
        (:data:`~fedlit.run_layout.VAL_CORRECT_FILE`)."""
        val_only = self.config.val_only
        if val_only and prefix != "test":
            return {}
        seed_all(derive_seed(self.seed, 0, EVAL))
        network = scored(self.method.eval_network(), self.data, self.trainer.device(), shared=True)
        evaluator = Evaluator(network, self.data.num_classes)
        metrics = {}
        if not val_only:
            self.trainer.test(evaluator, self.data.test_dataloader())
            metrics = evaluator.metrics(prefix)
        if prefix == "test" and len(self.data.val):
            self.trainer.test(evaluator, self.data.val_dataloader())  # its sums start afresh
            metrics |= evaluator.metrics("val")
            if val_only and round_idx is not None:
                self._record_val(round_idx, evaluator.correct())
        return metrics

    def _record_val(self, round_idx: int, correct: Sequence[bool]) -> None:
        """Append round ``round_idx``'s validation correctness to the run's record."""
        bits = "".join("1" if c else "0" for c in correct)
        path = self.checkpoint_path.parent.parent / VAL_CORRECT_FILE
        with path.open("a") as out:
            out.write(json.dumps({"round": round_idx, "correct": bits}) + "\n")

    def evaluate_encoder(self) -> dict[str, float]:
        """The configured protocols (finetune, linear) on the global encoder: ``eval/<p>_acc``."""
        out = {}
        for protocol in self.config.final_eval:
            seed_all(derive_seed(self.seed, self.config.rounds, EVAL))
            out[f"eval/{protocol}_acc"] = evaluate_encoder(
                self.method.encoder(),
                protocol,
                self.data,
                self.trainer,
                epochs=self.config.eval_epochs,
                lr=self.config.eval_lr,
            )
        return out

    def check_survivors(
        self,
        round_idx: int,
        sampled: int,
        updates: Sequence[ClientUpdate],
        faults: Sequence[ClientFault],
    ) -> None:
        """Stop the run (:class:`RoundFailed`) if fewer than ``federation.min_clients`` of the
        round's ``sampled`` clients survived; the message names the round and the faults."""
        if len(updates) >= self.config.min_clients:
            return
        raise RoundFailed(
            f"round {round_idx}: {len(updates)} of {sampled} clients survived, fewer than "
            f"federation.min_clients={self.config.min_clients} "
            f"({'; '.join(f.describe() for f in faults)}); {self._kept(round_idx)}"
        )

    def check_finite(self, round_idx: int, stage: str) -> None:
        """Stop the run (:class:`RoundFailed`) if a floating-point tensor of the method's state
        (its networks, buffers and extra state) holds NaN or an infinity after
        ``stage``: a model that is no longer finite is never evaluated or checkpointed."""
        bad = nonfinite_tensors(self.method.state_dict())
        if bad:
            raise RoundFailed(
                f"round {round_idx}: the global model is not finite after {stage} "
                f"({name_list(bad)}); {self._kept(round_idx)}"
            )

    def _kept(self, round_idx: int) -> str:
        """What a run stopped in round ``round_idx`` leaves: its last good checkpoint."""
        if round_idx > 1 and self.checkpoint_path.is_file():
            return (
                f"the run stops; nothing of round {round_idx} is written and its last "
                f"checkpoint, round {round_idx - 1}, is kept: {self.checkpoint_path}"
            )
        return f"the run stops in round {round_idx}, before its first checkpoint"
