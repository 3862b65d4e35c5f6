"""BatchNorm statistics re-estimated before a model is scored.

During training a BatchNorm layer's running statistics follow the weights with momentum 0.1,
so after a step at a high learning rate they lag behind them, and a network is scored with
statistics of weights it no longer has. Every scored network (``test/acc``, FedSEAL's thresholds,
the finetune protocol) is therefore a copy whose running statistics are re-estimated on the
server's clean (un-augmented) labeled images, the same way for every method.

A network that keeps its re-estimated statistics (FedSEAL's w^t, :func:`recalibrate`) is not
re-estimated again when it is scored while nothing has changed: a second pass over the same
images on the same device gives the same statistics, bit for bit (:class:`Estimate`).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.server import ServerData


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
    network: nn.Module,
    data: FederatedDataModule,
    device: torch.device | None = None,
    shared: bool = False,
) -> nn.Module:
    """The network that is scored for ``network``: a copy with its BatchNorm statistics
    re-estimated on the server's clean labeled images (:func:`recalibrated`), in batches of
    ``data.eval_batch_size``: one batch, a full pass's statistics that no batch size changes,
    where the server holds at most that many images (the default 1,000 holds the common
    protocol's 500 and FedCon's 1%); larger server sets (the 5,000 images of the CIFAR and
    STL-10 paper recipes) get the mean of the batches' statistics, which depends on the batch
    size (:func:`recalibrated`); ``network`` itself where the server holds no images (labels at
    the clients). ``device``: where the pass runs (the training device: a ResNet-18's pass
    over 500 images takes about 3 s on this project's 2-core CPU). No pass where ``network``
    holds the statistics it would give (:func:`recalibrate`, :class:`Estimate`): a copy of
    it, bit for bit what the pass would have made; ``shared``: ``network`` itself there, where
    it lies on ``device`` (for a caller that changes none of its state and restores its mode,
    as :func:`fedlit.federation.fit.loop.test` does)."""
    if data.labels_at != "server" or len(data.server) == 0:
        return network
    estimate = _ESTIMATES.get(network)
    if estimate is not None and estimate.holds(network, data.server_data, device):
        here = next(network.parameters()).device == _pass_device(network, device)
        if shared and here:
            return network  # it holds what a second pass would give: no pass, no copy
        return copy.deepcopy(network).eval()  # what a second pass would give: no pass
    return recalibrated(network, data.server_plain_dataloader(), device)


def recalibrate(
    network: nn.Module, data: FederatedDataModule, device: torch.device | None = None
) -> None:
    """Give ``network`` itself the statistics :func:`scored` gives its copy (a network that
    keeps them: FedSEAL's w^t), and remember that it holds them (:class:`Estimate`):
    :func:`scored` then copies ``network`` instead of re-estimating the statistics again,
    while its state is the one this left and the images and the device are the same.

    Where the pass runs on the device the network lies on (the training device, where the
    server's network stays), it runs on the network itself: no copy of it, the same
    statistics bit for bit (the pass reads only the weights and the images)."""
    if data.labels_at != "server" or len(data.server) == 0 or not has_batchnorm(network):
        return
    where = _pass_device(network, device)
    estimate = _ESTIMATES.get(network)
    if estimate is not None and estimate.holds(network, data.server_data, device):
        return  # it holds them already
    if next(network.parameters()).device == where:
        with torch.no_grad():
            torch.optim.swa_utils.update_bn(data.server_plain_dataloader(), network, device=where)
    else:  # a pass elsewhere, on a copy there
        network.load_state_dict(
            recalibrated(network, data.server_plain_dataloader(), device).state_dict()
        )
    state = {k: v.detach().clone() for k, v in network.state_dict().items()}
    _ESTIMATES[network] = Estimate(weakref.ref(data.server_data), where, state)


@dataclass(frozen=True)
class Estimate:
    """What :func:`recalibrate` left in a network: statistics re-estimated on ``server``'s
    clean labeled images (in its batches of ``eval_batch_size``) on ``device``, and the whole
    state the network then had (its weights and those statistics).

    A pass re-estimates the statistics from the weights and the images alone (torch's
    ``update_bn`` resets them first), and on one device the same inputs give the same result
    bit for bit; so while the network's state is still ``state`` (anything that trains,
    averages or loads weights into it since changes it), a pass over the same images on the
    same device would give the statistics it holds. A pass on another device (a GPU's
    evaluation after a pass on the CPU) may differ in the last bits and is not skipped."""

    server: weakref.ref[ServerData]
    device: torch.device
    state: dict[str, Tensor]

    def holds(self, network: nn.Module, server: ServerData, device: torch.device | None) -> bool:
        """Whether a pass over ``server``'s images on ``device`` (None: the network's own)
        would give ``network`` the statistics it holds."""
        if self.server() is not server or self.device != _pass_device(network, device):
            return False
        state = network.state_dict()
        return state.keys() == self.state.keys() and all(
            _same(value, self.state[key]) for key, value in state.items()
        )


#: Each network that :func:`recalibrate` gave its statistics, while it lives.
_ESTIMATES: weakref.WeakKeyDictionary[nn.Module, Estimate] = weakref.WeakKeyDictionary()


def _pass_device(network: nn.Module, device: torch.device | None) -> torch.device:
    """Where :func:`recalibrated` runs its pass: ``device``, or the network's own; a GPU
    without its index is the current one."""
    where = next(network.parameters()).device if device is None else torch.device(device)
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    return where


def _same(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` hold the same values, bit for bit, of one dtype and one layout (a
    channels-last network's convolutions may round otherwise) on one device."""
    alike = (a.device, a.dtype, a.shape, a.stride()) == (b.device, b.dtype, b.shape, b.stride())
    return alike and torch.equal(a, b)
