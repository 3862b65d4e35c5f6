"""SemiFL (Diao, Ding and Tarokh, NeurIPS 2022, arXiv 2106.01432): alternate training of the
server on its labels and of the clients on pseudo-labels from the global model."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fedlit.aggregation import Aggregated
from fedlit.aggregation.momentum import ServerMomentum
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.evaluation import recalibrate
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload
from fedlit.methods.client_side import ClientSetup, ClientSide, ClientUpdate
from fedlit.methods.plan import SERVER_LAST, RoundPlan, Step
from fedlit.models import Architecture
from fedlit.objectives import Objective, Optimization
from fedlit.objectives import SemiFLClient, SemiFLLoss
from fedlit.search_space import CLIENT_SPACE, uniform


#: SemiFL's "vanilla combination" (its Figure 4a): the broadcast, then the server trains from it
#: beside the clients, and the aggregate averages its model in.
PARALLEL = RoundPlan((Step.BROADCAST, Step.SERVER, Step.CLIENTS, Step.AGGREGATE))


class SemiFL(FederatedMethod):
    """SemiFL: each round the server sends the global model; each sampled client labels its
    images once with it and trains the fix and mix losses on the confident ones
    (:class:`~fedlit.objectives.SemiFLClient`); the uploads are averaged (FedAvg by n_k) and
    the server steps towards the average with momentum beta_g
    (:func:`~fedlit.aggregation.momentum.momentum_step`); then the server fine-tunes the
    result with CE on its labels (:data:`~fedlit.methods.plan.SERVER_LAST`): what the next
    round sends. Under static BatchNorm (sBN) the server re-estimates the network's BatchNorm
    statistics on its clean labeled images as it sends it: the statistics the clients label
    with (in eval mode; they train in train mode, on their batches' statistics).

    Logged per round (client means): ``client/fix``, ``client/mix``, ``client/mask_rate`` and
    ``pseudo/frac`` (the confident fraction of a client's images) and, against the clients'
    hidden true labels (diagnosis only; the loss never sees them), ``pseudo/acc``.

    Args:
        loss: tau, the confidence threshold (0.95), alpha, mixup's Beta(alpha, alpha) (0.75),
            mix_weight (1) and FedProx's mu (:class:`~fedlit.objectives.SemiFLLoss`).
        global_pseudo_labels: the clients label once a round with the received model (SemiFL);
            false: each batch with the network being trained (FixMatch's rule).
        server_finetune: the server fine-tunes after aggregation (SemiFL's alternate training,
            :data:`~fedlit.methods.plan.SERVER_LAST`); false: it trains beside the clients
            from the model it sent (:data:`PARALLEL`) and its model is averaged in, half and
            half with the clients' average (SemiFL's "vanilla combination").
        mixup: add the mix loss.
        static_bn: sBN, the BatchNorm statistics sent are re-estimated on the server's clean
            labeled images; false: the running statistics as trained and averaged.
        global_momentum: beta_g of the server's momentum (0.5); 0: plain averaging.
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    #: SemiFL's threshold (0.95; FixMatch's ablation spans 0.7-0.99) and mixup's alpha
    #: (0.75; MixMatch's range 0.1-1), and the server's momentum (0.5; 0-0.9).
    search_space = {
        **CLIENT_SPACE,
        "model.init_args.loss.tau": uniform(0.7, 0.99),
        "model.init_args.loss.alpha": uniform(0.1, 1.0),
        "model.init_args.global_momentum": uniform(0.0, 0.9),
    }

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: SemiFLLoss = SemiFLLoss(),
        global_pseudo_labels: bool = True,
        server_finetune: bool = True,
        mixup: bool = True,
        static_bn: bool = True,
        global_momentum: float = 0.5,
    ) -> None:
        super().__init__(network, optim)
        for name, value in (
            ("global_pseudo_labels", global_pseudo_labels),
            ("server_finetune", server_finetune),
            ("mixup", mixup),
            ("static_bn", static_bn),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"model.init_args.{name} must be true or false, got {value!r}")
        if not 0.0 <= global_momentum < 1.0:  # False for NaN too
            raise ValueError(
                f"model.init_args.global_momentum must be in [0, 1), got {global_momentum}"
            )
        self.loss = loss
        self.global_pseudo_labels, self.server_finetune = global_pseudo_labels, server_finetune
        self.mixup, self.static_bn = mixup, static_bn
        #: the run's data (:meth:`validate_data`), sBN's images: a weak reference, so that
        #: a copy of the method (the checks before a run) does not copy the images
        self.data: weakref.ref[FederatedDataModule] | None = None
        #: the server's velocity over the network's parameters (in checkpoints); None at 0
        self.momentum = (
            ServerMomentum(
                ((k, p.shape) for k, p in self.network.named_parameters() if self.is_shared(k)),
                global_momentum,
            )
            if global_momentum > 0
            else None
        )

    def round_plan(self) -> RoundPlan:
        """SemiFL's alternate training (:data:`~fedlit.methods.plan.SERVER_LAST`), or, without
        the fine-tune, :data:`PARALLEL`: the server trains from the model it sent, beside the
        clients, and its model enters the aggregate."""
        return SERVER_LAST if self.server_finetune else PARALLEL

    def validate_data(self, data: FederatedDataModule) -> None:
        """The base's checks; the data module is kept for sBN's pass (the server's clean
        labeled images, at every broadcast)."""
        super().validate_data(data)
        self.data = weakref.ref(data)

    def broadcast(self) -> Payload:
        """The global model; under sBN its BatchNorm statistics first re-estimated on the
        server's clean labeled images (:func:`~fedlit.evaluation.recalibrate`, on the network's
        device): what the clients label with. SemiFL's server does so as it distributes."""
        if self.static_bn:
            data = self.data() if self.data is not None else None
            if data is None:  # sBN never skipped in silence
                raise RuntimeError(
                    "model.static_bn=True: SemiFL re-estimates BatchNorm on the server's "
                    "labeled images at each broadcast, and holds no data module (the federation "
                    "gives it through validate_data(data) before the first round); give it one, "
                    "or set model.static_bn=false"
                )
            recalibrate(self.network, data)
        return super().broadcast()

    def initialize(self) -> None:
        super().initialize()
        if self.momentum is not None:
            for velocity in self.momentum.velocity().values():
                velocity.zero_()

    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """The uploads' FedAvg (without the fine-tune, averaged half and half with the server's
        trained model, as SemiFL's parallel baseline), then the server's momentum step from
        the network it holds towards it."""
        uploads, counts = [u.model for u in updates], [u.num_examples for u in updates]
        if not self.server_finetune:  # the server's model, as much as all clients together
            uploads, counts = [self.server_model(), *uploads], [sum(counts), *counts]
        result = self.aggregator(uploads, counts)
        state = result.state
        if self.momentum is not None:
            state = self.momentum(self.server_model(), state)
            result = replace(result, state=state)
        self.network.load_state_dict(state, strict=False)
        return result

    def client_side(self) -> SemiFLClientSide:
        return SemiFLClientSide(
            self._client_setup(),
            loss=self.loss,
            global_labels=self.global_pseudo_labels,
            mix=self.mixup,
        )


class SemiFLClientSide(ClientSide):
    """SemiFL's client: :class:`~fedlit.objectives.SemiFLClient` on the received model, over
    (index, weak, strong) batches of its images.

    Args:
        loss, global_labels, mix: as :class:`~fedlit.objectives.SemiFLClient` takes them.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(
        self, setup: ClientSetup, loss: SemiFLLoss, global_labels: bool, mix: bool
    ) -> None:
        super().__init__(setup, ("weak", "strong"))
        self.loss, self.global_labels, self.mix = loss, global_labels, mix

    def loader(self, client: ClientData) -> ImageBatches:
        return client.dataloader(self.views, with_index=True)

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        objective = SemiFLClient(
            self.model(payload),
            loss=self.loss,
            global_labels=self.global_labels,
            mix=self.mix,
            **self.optimizer_kwargs(),
        )
        # the hidden labels feed the pseudo/acc diagnosis only, computed on the client
        hidden = client.hidden_labels if client.shard.has_labels else None
        objective.attach(client.plain_dataloader(), hidden)
        return objective
