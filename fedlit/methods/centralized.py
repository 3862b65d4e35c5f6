"""The centralized reference: FixMatch (or UDA) with every client's images at the server.

Not a federated method: what semi-supervised learning gives at the federated runs' budget
when nothing is lost to federation (client drift, averaging, the clients' small shards), so
that a flat federated result can be told apart from federation losing the gain. Marked
``centralized`` in results tables, as the oracle is marked ``oracle``.
"""

from __future__ import annotations

from typing import ClassVar

from lightning.pytorch.utilities import CombinedLoader

from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.data.mapped import joined
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod
from fedlit.methods.plan import CENTRALIZED, RoundPlan
from fedlit.models import Architecture
from fedlit.objectives import (
    UDA,
    ConsistencyLoss,
    FixMatch,
    FixMatchLoss,
    Objective,
    Optimization,
    UDALoss,
    WeakStrongObjective,
)
from fedlit.search_space import CLIENT_SPACE


def pooled_loader(data: FederatedDataModule, views: tuple[str, ...]) -> ImageBatches:
    """Every client's whole shard, concatenated in client order, as shuffled batches of
    ``views`` of ``data.client_batch_size`` images (no labels)."""
    images = joined([shard.images for shard in data.clients])
    return ImageBatches(images, data.spec, views, data.client_batch_size, shuffle=True)


class CentralizedConsistency(FederatedMethod):
    """FedAvg-FixMatch's (or -UDA's) round with the federation taken out: the server trains CE
    on its labels (``server_epochs``), then trains :attr:`objective_class`'s unlabeled loss on
    (weak, strong) views of every client's images pooled at the server, for as many steps as
    the round's clients take together in the federated run (``clients_per_round`` x
    ``local_epochs`` x a shard's batches, or x ``local_steps``:
    :func:`~fedlit.federation.server.client_steps_per_round`), in batches of
    ``data.client_batch_size`` at the clients' learning rate (``optim.client_lr`` and its
    schedule), then fine-tunes with CE again (:data:`~fedlit.methods.plan.CENTRALIZED`). The
    same labeled set, the same images, the same number of unlabeled steps and the same server
    training as the federated method; one learner instead of C averaged ones. Nothing is
    communicated.

    With ``labeled_in_step``, each of those steps also takes a batch of the server's labeled
    images (``data.batch_size``, weak views, cycled) and trains CE on it beside the unlabeled
    loss, in one forward pass: FixMatch's (or UDA's) own L_s + L_u
    (:meth:`~fedlit.objectives.WeakStrongObjective.joint_step`), as a centralized
    semi-supervised learner trains, where the federated clients, holding no labels, train the
    unlabeled loss alone.

    Args:
        loss: the objective's settings (``mu``, FedProx's term, is anchored at the model the
            step starts from).
        labeled_in_step: a labeled batch in every unlabeled step (see above); False: the
            unlabeled loss alone, as the federated clients train.
        The others: see :class:`FederatedMethod`.
    """

    #: its unlabeled steps run at the clients' learning rate
    search_space = CLIENT_SPACE

    centralized = True
    #: The unlabeled loss, trained on the pooled images.
    objective_class: ClassVar[type[WeakStrongObjective]]

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        *,
        loss: ConsistencyLoss,
        labeled_in_step: bool = False,
    ) -> None:
        super().__init__(network, optim)
        if not isinstance(labeled_in_step, bool):
            raise ValueError(f"model.labeled_in_step must be a bool, got {labeled_in_step!r}")
        self.loss = loss
        self.labeled_in_step = labeled_in_step

    def round_plan(self) -> RoundPlan:
        return CENTRALIZED

    def validate_data(self, data: FederatedDataModule) -> None:
        super().validate_data(data)
        if data.stream_steps is not None:
            raise ValueError(
                f"data.stream_steps={data.stream_steps}: the centralized reference trains on "
                "every client's whole shard at once; it has no stream"
            )

    # --- the plan's centralized step (fedlit.methods.plan.CentralTraining) ----------------
    def central_objective(self) -> Objective:
        kwargs = self.optim.objective_kwargs(
            self.optim.client_lr, self.round_idx, self.total_rounds
        )
        return self.objective_class(self.network, loss=self.loss, **kwargs)

    def central_loader(self, data: FederatedDataModule) -> ImageBatches | CombinedLoader:
        pooled = pooled_loader(data, ("weak", "strong"))
        if not self.labeled_in_step:
            return pooled
        labeled = data.server_dataloader(("weak",))
        return CombinedLoader({"unlabeled": pooled, "labeled": labeled}, "max_size_cycle")


class CentralizedFixMatch(CentralizedConsistency):
    """The centralized reference of FedAvg-FixMatch: :class:`CentralizedConsistency` with
    FixMatch's unlabeled loss (:class:`~fedlit.objectives.FixMatch`).

    Args:
        loss: tau, the confidence threshold, and mu (:class:`~fedlit.objectives.FixMatchLoss`).
        labeled_in_step: see :class:`CentralizedConsistency`.
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    objective_class = FixMatch

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FixMatchLoss = FixMatchLoss(),
        *,
        labeled_in_step: bool = False,
    ) -> None:
        super().__init__(network, optim, loss=loss, labeled_in_step=labeled_in_step)


class CentralizedUDA(CentralizedConsistency):
    """The centralized reference of FedAvg-UDA: :class:`CentralizedConsistency` with UDA's
    soft consistency (:class:`~fedlit.objectives.UDA`).

    Args:
        loss: the sharpening temperature, the confidence threshold and mu
            (:class:`~fedlit.objectives.UDALoss`).
        labeled_in_step: see :class:`CentralizedConsistency`.
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    objective_class = UDA

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: UDALoss = UDALoss(),
        *,
        labeled_in_step: bool = False,
    ) -> None:
        super().__init__(network, optim, loss=loss, labeled_in_step=labeled_in_step)
