"""FedSEAL (paper 002, section 4 and Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedlit.aggregation import Mean
from fedlit.aggregation.payloads import StateDict, tensor_part
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.evaluation import recalibrate
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload, seed_classifier
from fedlit.methods.client_side import ClientSetup, ClientSide
from fedlit.methods.plan import RoundPlan, Step
from fedlit.models import Architecture
from fedlit.objectives import (
    FedSEALClient,
    FedSEALLoss,
    Objective,
    Optimization,
    class_thresholds,
)
from fedlit.objectives.fedseal import predict_probabilities, self_ensemble
from fedlit.search_space import CLIENT_SPACE, log_uniform, uniform

THRESHOLDS = "thresholds"  # the payload part of the class-wise thresholds tau^t


class FedSEAL(FederatedMethod):
    """FedSEAL: self-ensemble pseudo-labels with server-gauged class-wise thresholds, and
    complementary negative learning.

    Before round 1 the server trains w^0 on its labeled set alone (bootstrap, 4.1.3). Each
    round the server averages the client models (plain mean), trains E_s epochs of CE on the
    result, and computes the class-wise thresholds tau^t on its validation set (eq 5), sent
    with the model. Every client receives the model (Algorithm 1, line 6) and updates its
    running mean of the received models' predictions on its data (eq 8, persistent client
    state, never uploaded): the clients not sampled pay one un-augmented forward pass over
    their data and receive the model's bytes. A sampled client then builds the positive set
    (pbar_{y+} >= tau_{y+}, eq 10) and the complementary set (eqs 11-12, theta), and trains
    lambda_t L+ + L- (eqs 13-15) with lambda_t = lambda_max x a Gaussian ramp-up over the
    first ``loss.ramp`` of the run (round t of R is at t / R), so a shorter run ramps as far. The
    paper's schedule is ``optim: {lr_schedule: constant, lr_decay: 0.995}`` (0.995 per round).

    Logged per round (client means): ``pseudo/pos_frac``, ``pseudo/neg_frac`` and, against the
    clients' hidden true labels (diagnosis only; the loss never sees them), ``pseudo/pos_acc``
    (pseudo-labels right) and ``pseudo/neg_acc`` (complementary labels really wrong); and what
    the round's clients were sent: ``fedseal/lambda`` and ``fedseal/tau_<m>`` per class.

    Args:
        loss: theta, the complementary threshold (paper: 0.05), lambda_max, the positive-loss
            weight once ramped up, ramp, the fraction of the run lambda ramps up over, and the
            ablations negative_learning and fixed_tau (:class:`~fedlit.objectives.FedSEALLoss`).
        bootstrap_epochs: server epochs on the labeled set before round 1.
        self_ensemble: False uses the current model's predictions only (the paper's ablation
            "w/o self-ensemble learning", 5.2.5).
        The others: see :class:`FederatedMethod`.
    """

    #: theta (paper 002: 0.05), lambda_max (1) and the share of the run lambda ramps over.
    search_space = {
        **CLIENT_SPACE,
        "model.init_args.loss.theta": log_uniform(0.01, 0.2),
        "model.init_args.loss.lambda_max": log_uniform(0.25, 4.0),
        "model.init_args.loss.ramp": uniform(0.0, 0.5),
    }

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FedSEALLoss = FedSEALLoss(),
        bootstrap_epochs: int = 10,
        self_ensemble: bool = True,
    ) -> None:
        if bootstrap_epochs < 0:
            raise ValueError(f"model.bootstrap_epochs must be >= 0, got {bootstrap_epochs}")
        super().__init__(network, optim)
        self.loss = loss
        self.use_self_ensemble = self_ensemble
        self.aggregator = Mean()  # w_bar^t, the plain mean (paper 002 4.1.1)
        self.bootstrap_epochs = bootstrap_epochs
        # Until the server has measured the model, no example passes the filter (tau = 1).
        self.thresholds: torch.Tensor
        first = 1.0 if loss.fixed_tau is None else loss.fixed_tau
        self.register_buffer("thresholds", torch.full((self.network_settings.num_classes,), first))
        self.sent_thresholds = self.thresholds.clone()  # those of the round's broadcast

    def round_plan(self) -> RoundPlan:
        """Aggregation, then the server's step (Algorithm 1); every client receives the
        broadcast (line 6); ``bootstrap_epochs`` of the server's objective before round 1."""
        steps = (Step.BROADCAST, Step.CLIENTS, Step.RECEIVE, Step.AGGREGATE, Step.SERVER)
        return RoundPlan(steps, self.bootstrap_epochs)

    def validate_data(self, data: FederatedDataModule) -> None:
        super().validate_data(data)
        if data.val_per_class < 1:
            raise ValueError(
                "data.val_per_class must be >= 1 for FedSEAL: its thresholds (eq 5) are "
                f"measured on the server's validation set, got {data.val_per_class}"
            )
        if data.stream_steps is not None:
            raise ValueError(
                "data.stream_steps: FedSEAL's self-ensemble follows each client example across "
                "rounds, which streaming data does not keep"
            )

    # --- server -------------------------------------------------------------------------
    def server_step_done(
        self, objective: Objective, data: FederatedDataModule, device: torch.device | None = None
    ) -> None:
        """w^t becomes the model as it is scored (its BatchNorm statistics re-estimated on the
        clean labeled images), so the model the clients receive, the one eq 5 measures and
        the one ``test/acc`` scores are one w^t; then tau^t from its predictions on the
        validation set (eq 5), clipped to [0, 1] (4.1.2: tau_m in [0, 1]), or
        ``loss.fixed_tau`` for every class; both on ``device``, the training device."""
        self.measure(data, device)

    def measure(self, data: FederatedDataModule, device: torch.device | None = None) -> None:
        """The model as it is scored (BatchNorm statistics re-estimated), and tau^t measured on
        it (eq 5; see :meth:`server_step_done`), both on ``device`` (None: the network's own;
        the training device, as the evaluation's pass). The evaluation that follows scores
        this network without re-estimating its statistics again where the pass would give
        the same ones: same images, same device, nothing changed since
        (:func:`~fedlit.evaluation.recalibrate`)."""
        recalibrate(self.network, data, device)
        if self.loss.fixed_tau is not None:
            self.thresholds = torch.full_like(self.thresholds, self.loss.fixed_tau)
            return
        probs, labels = predict_probabilities(self.network, data.val_dataloader(), device)
        self.thresholds = class_thresholds(probs, labels).clamp(0.0, 1.0)  # type: ignore[arg-type]

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """w^0 is the source's network, in place of the bootstrap's (4.1.3: w^0 trained on the
        labeled set alone, what a Server-SL source is); tau^0 is measured on it as the
        bootstrap's end measures it (:meth:`measure`), so round 1's clients receive
        thresholds of the model they receive."""
        seed_classifier(self.network, network)
        self.measure(data)

    def end_round(self) -> dict[str, float]:
        """What the clients were sent this round: ``fedseal/lambda`` (lambda_t) and
        ``fedseal/tau_<m>``, each class's threshold tau_m."""
        lam = self.loss.weight(self.round_idx / self.total_rounds)  # as the clients' this round
        return {"fedseal/lambda": float(lam)} | {
            f"fedseal/tau_{m}": float(t) for m, t in enumerate(self.sent_thresholds.tolist())
        }

    # --- communication --------------------------------------------------------------------
    def broadcast(self) -> Payload:
        self.sent_thresholds = self.thresholds.clone()
        return super().broadcast() | {THRESHOLDS: self.thresholds.clone()}

    # --- client -------------------------------------------------------------------------
    def client_side(self) -> FedSEALClientSide:
        return FedSEALClientSide(
            self._client_setup(), loss=self.loss, self_ensemble=self.use_self_ensemble
        )


class FedSEALClientSide(ClientSide):
    """FedSEAL's client (paper 002 Algorithm 1): the self-ensemble of the received models'
    predictions on its data (persistent state, never uploaded), the positive and complementary
    sets from it and the received thresholds, and lambda_t L+ + L- on (plain, strong) views.

    Args:
        loss: theta, lambda_max, ramp and the ablations (:class:`~fedlit.objectives.FedSEALLoss`).
        self_ensemble: False uses the received model's predictions only.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(self, setup: ClientSetup, loss: FedSEALLoss, self_ensemble: bool) -> None:
        super().__init__(setup, ("plain", "strong"))
        self.loss, self.use_self_ensemble = loss, self_ensemble
        self.lam = loss.weight(0.0)  # lambda_t, set each round by on_round_start

    def on_round_start(self, round_idx: int, total_rounds: int) -> None:
        super().on_round_start(round_idx, total_rounds)
        self.lam = self.loss.weight(round_idx / total_rounds)

    def loader(self, client: ClientData) -> ImageBatches:
        return client.dataloader(self.views, with_index=True)

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        ensemble = (state["mean"], state["count"]) if state and self.use_self_ensemble else None
        objective = FedSEALClient(
            self.model(payload),
            thresholds=tensor_part(payload, THRESHOLDS),
            lam=self.lam,
            loss=self.loss,
            ensemble=ensemble,
            **self.optimizer_kwargs(),
        )
        # the hidden labels feed the pseudo/*_acc diagnostics only, computed on the client
        # (none where the clients' images come from an unlabeled split)
        hidden = client.hidden_labels if client.shard.has_labels else None
        objective.attach(client.plain_dataloader(), hidden)
        return objective

    def receive(
        self,
        payload: Payload,
        clients: Sequence[ClientData],
        states: Sequence[Any],
        device: torch.device,
    ) -> list[Any]:
        """The clients not sampled this round still add w^t's predictions to their
        self-ensembles (eq 8), as a sampled client does before training; w^t is built once."""
        if not self.use_self_ensemble or not clients:
            return list(states)
        network = self.model(payload).to(device)
        updated = []
        for client, state in zip(clients, states, strict=True):
            probs, _ = predict_probabilities(network, client.plain_dataloader())
            previous, count = (state["mean"], state["count"]) if state else (None, 0)
            updated.append({"mean": self_ensemble(previous, probs, count + 1), "count": count + 1})
        return updated

    def state(self, objective: Objective, previous: Any) -> Any:
        assert isinstance(objective, FedSEALClient) and objective.ensemble is not None
        pbar, count = objective.ensemble
        return {"mean": pbar.detach().cpu().clone(), "count": int(count)}
