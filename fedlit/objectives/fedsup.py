"""FedSup's client objective (paper 000, section 4.1.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightly.loss import NegativeCosineSimilarity
from lightly.models.utils import deactivate_requires_grad
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step


def feature_map_mse(online: list[Tensor], target: list[Tensor]) -> Tensor:
    """Layer-wise MSE between the stage outputs of two backbones, averaged over the stages."""
    losses = [
        F.mse_loss(o.float(), t.detach().float()) for o, t in zip(online, target, strict=True)
    ]
    return torch.stack(losses).mean()


class FedSupClient(Objective):
    """L = L_Con + w * L_MSE (paper 000 4.1.1, Figure 4.1, Algorithm 2).

    L_Con: BYOL-shaped negative cosine between the online net's prediction
    (backbone -> projector -> predictor) and the projection of the *server's supervised net*
    (frozen, stop-gradient, in eval mode), between the raw and the augmented image, symmetrised:
    1/2 D(p(A(x)), z_S(x)) + 1/2 D(p(x), z_S(A(x))). L_MSE: MSE between the feature maps of every
    backbone stage of the two nets on the raw image. ``mse_weight`` is lambda_s^(t/T).
    Batches: (augmented (B, C, H, W), raw (B, C, H, W)).
    """

    def __init__(
        self, network: Classifier, target: Classifier, lr: float, mse_weight: float, **kw
    ) -> None:
        super().__init__(network, lr, **kw)
        deactivate_requires_grad(target)
        self.target = target
        self.mse_weight = mse_weight
        # the round's weight as a tensor the step reads (Objective.step_input): a new weight
        # each round neither recompiles a compiled step nor re-records its CUDA graphs
        self.mse_weight_tensor = torch.tensor(mse_weight)
        self.criterion = NegativeCosineSimilarity()

    def before_fit(self) -> None:
        self.step_input("mse_weight_tensor", self.mse_weight_tensor)
        self.target.eval()

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        aug, raw = batch
        net, target = self.network, self.target
        maps_raw = net.backbone.feature_maps(raw)
        p_raw = net.prediction(net.projection(net.backbone.pool(maps_raw[-1])))
        p_aug = net.prediction(net.projection(net.backbone(aug)))
        with torch.no_grad():
            target_maps_raw = target.backbone.feature_maps(raw)
            z_raw = target.projection(target.backbone.pool(target_maps_raw[-1]))
            z_aug = target.projection(target.backbone(aug))
        consistency = 0.5 * (self.criterion(p_aug, z_raw) + self.criterion(p_raw, z_aug))
        mse = feature_map_mse(maps_raw, target_maps_raw)
        loss = consistency + self.mse_weight_tensor * mse
        logged = {"loss": loss, "consistency": consistency, "feature_mse": mse}
        return loss, ((len(aug), logged),)
