"""Self-supervised client objectives on two views: SimCLR, SimSiam, BYOL (lightly's losses).

The network carries ``backbone``, ``projector`` and (SimSiam, BYOL) ``predictor`` modules.
Batches: (view_1 (B, C, H, W), view_2 (B, C, H, W)) of the same unlabeled images.
"""

from __future__ import annotations

from lightly.loss import NegativeCosineSimilarity, NTXentLoss
from lightly.models.utils import update_momentum
from lightly.utils.scheduler import cosine_schedule
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step
from fedlit.objectives.ema import frozen_copy


def project(network: Classifier, x: Tensor) -> Tensor:
    """z = projector(backbone(x)): (B, C, H, W) -> (B, dim)."""
    return network.projection(network.backbone(x))


class SimCLR(Objective):
    """NT-Xent between the projections of two views (paper 000 eq 3.3, symmetrised over 2B).

    Uses lightly's ``NTXentLoss`` with temperature ``temperature`` (0.5 in paper 000).
    """

    def __init__(self, network: Classifier, lr: float, temperature: float = 0.5, **kw) -> None:
        super().__init__(network, lr, **kw)
        self.criterion = NTXentLoss(temperature=temperature)

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        v1, v2 = batch
        loss = self.criterion(project(self.network, v1), project(self.network, v2))
        return loss, ((len(v1), {"loss": loss}),)


class SimSiam(Objective):
    """L = 1/2 D(p_1, stopgrad(z_2)) + 1/2 D(p_2, stopgrad(z_1)), D the negative cosine
    (paper 000 eq 3.6; lightly's ``NegativeCosineSimilarity``)."""

    def __init__(self, network: Classifier, lr: float, **kw) -> None:
        super().__init__(network, lr, **kw)
        self.criterion = NegativeCosineSimilarity()

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        v1, v2 = batch
        z1, z2 = project(self.network, v1), project(self.network, v2)
        p1, p2 = self.network.prediction(z1), self.network.prediction(z2)
        loss = 0.5 * (self.criterion(p1, z2.detach()) + self.criterion(p2, z1.detach()))
        return loss, ((len(v1), {"loss": loss}),)


class BYOL(Objective):
    """BYOL (paper 000 3.2.4): the SimSiam loss against a target network xi that tracks the
    online network theta by EMA, xi <- m xi + (1 - m) theta, m following lightly's
    ``cosine_schedule`` from ``ema_momentum`` to 1 over the local steps.

    The target exists only during local training (stateless clients): it is copied from the
    received online network when training starts and discarded afterwards.
    """

    def __init__(self, network: Classifier, lr: float, ema_momentum: float = 0.99, **kw) -> None:
        super().__init__(network, lr, **kw)
        self.base_momentum = ema_momentum
        self.target: Classifier | None = None
        self.criterion = NegativeCosineSimilarity()

    def before_fit(self) -> None:
        # the target's backbone and projector follow the online network's (the rest of the
        # copy is not used)
        self.target = frozen_copy(self.network).to(self.device)

    def after_fit(self) -> None:
        self.target = None

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        assert self.target is not None
        v1, v2 = batch
        p1 = self.network.prediction(project(self.network, v1))
        p2 = self.network.prediction(project(self.network, v2))
        t1, t2 = project(self.target, v1).detach(), project(self.target, v2).detach()
        loss = 0.5 * (self.criterion(p1, t2) + self.criterion(p2, t1))
        return loss, ((len(v1), {"loss": loss}),)

    def after_step(self) -> None:
        assert self.target is not None
        # this step is already counted: the schedule's step index is steps_taken() - 1
        step, total = self.steps_taken() - 1, self.planned_steps()
        m = cosine_schedule(step, total, self.base_momentum, 1.0)
        update_momentum(self.network.backbone, self.target.backbone, m)
        update_momentum(self.network.projector, self.target.projector, m)
