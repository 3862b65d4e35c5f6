"""The plain floor of ``host_round.py``: paper 002's FedSEAL round written directly in PyTorch,
with no fedlit object in it.

What it takes from fedlit, once, before any round is timed: the tensors (every client's uint8
images, the server's labeled, validation and test images with their labels, the data set's
channel means and deviations), the network's weights and FedSEAL's thresholds as the bootstrap
left them, and the protocol's numbers (rounds, epochs, batch sizes, learning rate and its
decay, momentum, weight decay, theta, lambda's ramp). From then on a round is torch alone:

- every client: the received weights loaded into its own copy of the network, its
  predictions over its images (eval mode, un-augmented), its running mean of them (eq 8), the
  positive and complementary sets (eqs 9-12), then one epoch of lambda L+ + L- (eqs 13-15,
  written out below) in shuffled batches of 64, SGD with ``foreach=True``;
- FedAvg: the plain mean of the uploads' floating tensors;
- the server: its epochs of cross-entropy on its labeled images in batches of 16; then its
  BatchNorm statistics re-estimated in one pass over the clean labeled images (the evaluation
  scores that model) and the class-wise thresholds measured on the validation set (eq 5);
- the evaluation: accuracy and mean cross-entropy on the validation and the test set.

The views are ``host_round.py``'s: normalisation only, computed per batch and per view (a
client batch's plain and strong views are two, as real augmentation makes them). Their random
parameters are drawn too (as the augmentation needs them), in one ``torch.rand`` a fit for
all its steps (the way a hand-written loop would draw them), and not used, as fedlit's
``normalise_only`` views do not use theirs. The random stream is its own (a generator per
round), so its numbers are not fedlit's: its test/acc is compared within the seeds' spread.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: rows of random parameters a view draws for each image (fedlit's augment.py: weak 3, strong
#: 3 + 2 RandAugment slots + 3 for Cutout)
WEAK_ROWS, STRONG_ROWS = 3, 8


class PlainNet(nn.Module):
    """``host_round.NearFree`` and a Linear head, as fedlit's Classifier over it (its keys
    less the backbone wrapper's ``body.``): images (N, C, H, W) -> logits (N, classes)."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.backbone = nn.Module()
        self.backbone.fc = nn.Linear(in_channels, 8)
        self.backbone.bn = nn.BatchNorm1d(8)
        self.head = nn.Sequential(nn.Linear(8, classes))

    def forward(self, x: Tensor) -> Tensor:
        b = self.backbone
        return self.head(b.bn(b.fc(x.mean(dim=(2, 3)))))  # type: ignore[operator]


def seal_loss(
    logits_plain: Tensor,
    logits_strong: Tensor,
    pseudo: Tensor,
    positive: Tensor,
    complementary: Tensor,
    lam: float,
) -> Tensor:
    """lambda L+ + L- on a batch (paper 002 eqs 13-15): L+ the mean cross-entropy of the
    strong view's logits against the pseudo-labels over the positive examples, L- the mean
    -log(1 - p_{y-}) of the plain view over the negative ones (complementary >= 0); each 0
    for an empty set. -log(1 - p) is -log1p(-p) below p = 1/2, else the log-sum-exp over all
    classes less that over the others (stable where p is near 1)."""
    pos = positive.float()
    ce = F.cross_entropy(logits_strong, pseudo, reduction="none")
    loss_pos = (ce * pos).sum() / pos.sum().clamp(min=1.0)
    neg = (complementary >= 0).float()
    label = complementary.clamp(min=0)[:, None]
    log_p = logits_plain.log_softmax(dim=1).gather(1, label).squeeze(1)
    own = torch.zeros_like(logits_plain, dtype=torch.bool).scatter_(1, label, True)
    others = torch.logsumexp(logits_plain.masked_fill(own, float("-inf")), dim=1)
    confident = torch.logsumexp(logits_plain, dim=1) - others
    half = math.log(0.5)
    small = -torch.log1p(-log_p.clamp(max=half).exp())
    per_example = torch.where(log_p < half, small, confident)
    loss_neg = (per_example * neg).sum() / neg.sum().clamp(min=1.0)
    return lam * loss_pos + loss_neg


class PlainFloor:
    """FedSEAL's rounds in plain PyTorch from a bootstrapped fedlit federation's tensors and
    weights (read once here; see the module's docstring)."""

    def __init__(self, fed: Any, seed: int = 0) -> None:
        data, method, cfg = fed.data, fed.method, fed.config
        self.seed, self.rounds = seed, cfg.rounds
        self.local_epochs, self.server_epochs = cfg.local_epochs, cfg.server_epochs
        self.client_batch, self.server_batch = data.client_batch_size, data.batch_size
        self.eval_batch = data.eval_batch_size
        optim = method.optim
        self.lr, self.lr_decay = optim.client_lr, optim.lr_decay
        self.server_lr = optim.server_lr
        self.momentum, self.weight_decay = optim.momentum, optim.weight_decay
        loss = method.loss
        self.theta, self.lambda_max, self.ramp = loss.theta, loss.lambda_max, loss.ramp
        self.clients = [
            data.client_data(c).plain_dataloader().images.clone() for c in range(data.num_clients)
        ]
        server = data.server_dataloader()
        self.server_x, self.server_y = server.images.clone(), server.labels.clone()
        self.val = (data.val.images.clone(), data.val.labels.clone())
        self.test = (data.test.images.clone(), data.test.labels.clone())
        self.mean = torch.tensor(data.spec.mean).view(1, -1, 1, 1)
        self.std = torch.tensor(data.spec.std).view(1, -1, 1, 1)
        classes = method.network.num_classes
        self.network = PlainNet(data.in_channels, classes)
        self.network.load_state_dict(  # fedlit wraps the backbone as backbone.body
            {
                k.replace("backbone.body.", "backbone."): v.detach().clone()
                for k, v in method.network.state_dict().items()
            }
        )
        self.thresholds = method.thresholds.detach().clone()
        self.ensembles: dict[int, tuple[Tensor, int]] = {}
        self.local = PlainNet(data.in_channels, classes)  # a client's copy, reloaded each fit

    def normalize(self, images: Tensor) -> Tensor:
        return (images.float() / 255.0 - self.mean) / self.std

    @torch.no_grad()
    def probabilities(self, network: nn.Module, images: Tensor) -> Tensor:
        network.eval()
        probs = [
            network(self.normalize(images[i : i + self.eval_batch])).softmax(-1)
            for i in range(0, len(images), self.eval_batch)
        ]
        network.train()
        return torch.cat(probs)

    def optimizer(self, network: nn.Module, lr: float) -> torch.optim.SGD:
        return torch.optim.SGD(
            network.parameters(),
            lr=lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            foreach=True,
        )

    def client(self, cid: int, lr: float, lam: float, g: torch.Generator) -> dict[str, Tensor]:
        images, net = self.clients[cid], self.local
        net.load_state_dict(self.network.state_dict())
        probs = self.probabilities(net, images)
        previous = self.ensembles.get(cid)
        t = 1 if previous is None else previous[1] + 1
        pbar = probs if previous is None else (t - 1) / t * previous[0] + probs / t
        self.ensembles[cid] = (pbar, t)
        confidence, pseudo = pbar.max(dim=1)
        positive = confidence >= self.thresholds[pseudo]
        candidates = pbar <= self.theta
        negative = ~positive & candidates.any(dim=1)
        complementary = torch.full_like(pseudo, -1)
        if negative.any():
            drawn = torch.multinomial(candidates[negative].float(), 1, generator=g)
            complementary[negative] = drawn.squeeze(1)
        optimizer = self.optimizer(net, lr)
        b = self.client_batch
        steps = len(images) // b
        for _ in range(self.local_epochs):
            order = torch.randperm(len(images), generator=g)
            torch.rand(steps, STRONG_ROWS, b, generator=g)  # the strong view's parameters
            for k in range(steps):
                idx = order[k * b : (k + 1) * b]
                x = images[idx]
                plain, strong = self.normalize(x), self.normalize(x)  # the two views
                logits_plain, logits_strong = net(torch.cat([plain, strong])).chunk(2)
                loss = seal_loss(
                    logits_plain,
                    logits_strong,
                    pseudo[idx],
                    positive[idx],
                    complementary[idx],
                    lam,
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return {k: v.detach().clone() for k, v in net.state_dict().items()}

    def server(self, lr: float, g: torch.Generator) -> None:
        net, b = self.network, self.server_batch
        optimizer = self.optimizer(net, lr)
        n = len(self.server_x)
        steps = n // b
        net.train()
        for _ in range(self.server_epochs):
            order = torch.randperm(n, generator=g)
            torch.rand(steps, WEAK_ROWS, b, generator=g)  # the weak view's parameters
            for k in range(steps):
                idx = order[k * b : (k + 1) * b]
                loss = F.cross_entropy(net(self.normalize(self.server_x[idx])), self.server_y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

    @torch.no_grad()
    def recalibrate(self) -> None:
        """BatchNorm statistics from one pass over the server's clean labeled images (all of
        them in one batch: the protocol's 500 fit in an evaluation batch)."""
        bns = [m for m in self.network.modules() if isinstance(m, nn.BatchNorm1d)]
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None
        self.network.train()
        self.network(self.normalize(self.server_x))
        for bn in bns:
            bn.momentum = 0.1

    @torch.no_grad()
    def accuracy(self, images: Tensor, labels: Tensor) -> tuple[float, float]:
        self.network.eval()
        right, loss = 0, torch.zeros(())
        for i in range(0, len(images), self.eval_batch):
            logits = self.network(self.normalize(images[i : i + self.eval_batch]))
            y = labels[i : i + self.eval_batch]
            right += int((logits.argmax(1) == y).sum())
            loss += F.cross_entropy(logits, y, reduction="sum")
        self.network.train()
        return right / len(labels), float(loss) / len(labels)

    def round(self, r: int) -> float:
        """Round ``r`` (1-based); returns its test accuracy."""
        g = torch.Generator().manual_seed(self.seed * 100_003 + r)
        lr = self.lr * self.lr_decay ** (r - 1)
        server_lr = self.server_lr * self.lr_decay ** (r - 1)
        x = min(r / self.rounds / self.ramp, 1.0) if self.ramp > 0 else 1.0
        lam = self.lambda_max * math.exp(-5.0 * (1.0 - x) ** 2)
        uploads = [self.client(cid, lr, lam, g) for cid in range(len(self.clients))]
        averaged = {
            k: torch.stack([u[k] for u in uploads]).mean(0) if v.is_floating_point() else v
            for k, v in uploads[0].items()
        }
        self.network.load_state_dict(averaged)
        self.server(server_lr, g)
        self.recalibrate()
        probs = self.probabilities(self.network, self.val[0])
        confidence, predicted = probs.max(dim=1)
        classes = probs.shape[1]
        summed = torch.zeros(classes).index_add_(0, predicted, confidence)
        counts = torch.bincount(self.val[1], minlength=classes).float()
        self.thresholds = (summed / counts).clamp(0.0, 1.0)
        self.accuracy(*self.val)
        return self.accuracy(*self.test)[0]
