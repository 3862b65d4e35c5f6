"""BatchNorm statistics re-estimated before a model is scored.

During training a BatchNorm layer's running statistics follow the weights with momentum 0.1,
so after a step at a high learning rate they lag behind them, and a network is scored with
statistics of weights it no longer has. Every scored network (``test/acc``, FedSEAL's thresholds,
the finetune protocol) is therefore a copy whose running statistics are re-estimated on the
server's clean (un-augmented) labeled images, the same way for every method.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedlit.data.datamodule import FederatedDataModule


def has_batchnorm(network: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in network.modules())


@torch.no_grad()
def recalibrated(
    network: nn.Module, images: Iterable[tuple[Tensor, ...]], device: torch.device | None = None
) -> nn.Module:
    """A copy of ``network`` whose BatchNorm running statistics are re-estimated on ``images``
    (batches whose first element is the input) on ``device`` (default: the network's own);
    the copy is returned on the network's device, ``network`` itself is not changed.

    torch's ``update_bn`` resets the statistics and averages every batch's statistics with equal
    weight (``momentum=None``): over one batch holding every image, exactly a full pass's mean
    and (unbiased) variance. Over several batches the result depends on how the images are
    batched: the mean of the batches' variances leaves out the spread of their means, a short
    last batch weighs as much as a full one, and in training mode every layer after the first
    sees inputs normalised with its batch's statistics. A network without BatchNorm is
    returned as it is.
    """
    if not has_batchnorm(network):
        return network
    clone = copy.deepcopy(network)
    home = next(clone.parameters()).device
    device = home if device is None else device
    torch.optim.swa_utils.update_bn(images, clone.to(device), device=device)
    return clone.to(home).eval()


def scored(
    network: nn.Module, data: FederatedDataModule, device: torch.device | None = None
) -> nn.Module:
    """The network that is scored for ``network``: a copy with its BatchNorm statistics
    re-estimated on the server's clean labeled images (:func:`recalibrated`), in batches of
    ``data.eval_batch_size``: one batch, a full pass's statistics that no batch size changes,
    where the server holds at most that many images (the default 1,000 holds the common
    protocol's 500 and FedCon's 1%); larger server sets (the 5,000 images of the CIFAR and
    STL-10 paper recipes) get the mean of the batches' statistics, which depends on the batch
    size (:func:`recalibrated`); ``network`` itself where the server holds no images (labels at
    the clients). ``device``: where the pass runs (the training device: a ResNet-18's pass
    over 500 images takes about 3 s on this project's 2-core CPU)."""
    if data.labels_at != "server" or len(data.server) == 0:
        return network
    return recalibrated(network, data.server_plain_dataloader(), device)
