"""FedSEAL's pieces (paper 002, section 4): class-wise thresholds, the self-ensemble, the
positive and complementary-negative sets, the complementary loss and the client objective."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step
from fedlit.objectives.schedules import gaussian_rampup


@torch.no_grad()
def predict_probabilities(
    network: nn.Module, loader: Iterable[tuple[Tensor, ...]], device: torch.device | None = None
) -> tuple[Tensor, Tensor | None]:
    """Softmax outputs of ``network`` in eval mode over batches ``(x,)`` or ``(x, y)``: (probs
    (N, M) on the CPU, labels (N,) or None). The mode is restored. ``device``: where they are
    computed (None: the network's own; another: by a copy of the network there)."""
    home = next(network.parameters()).device
    if device is not None and torch.device(device) != home:
        network = copy.deepcopy(network).to(device)
    was_training = network.training
    network.eval()
    device = next(network.parameters()).device
    probs, labels = [], []
    for batch in loader:
        probs.append(network(batch[0].to(device)).float().softmax(-1).cpu())
        if len(batch) > 1:
            labels.append(batch[1])
    network.train(was_training)
    return torch.cat(probs), (torch.cat(labels) if labels else None)


class AttachedImages:
    """Mixin of the client objectives that read their client's un-augmented images before
    training (FedSEAL, SemiFL, (FL)^2): the images and the hidden labels the method attaches
    (:meth:`attach`), and the network's predictions on them (:meth:`predict_attached`)."""

    images: Iterable[tuple[Tensor, ...]] | None = None
    hidden_labels: Tensor | None = None

    def attach(
        self, images: Iterable[tuple[Tensor, ...]], hidden_labels: Tensor | None = None
    ) -> None:
        """The client's un-augmented images, in index order (batches ``(x,)``), and, for the
        diagnostics only, their true labels (never used by the loss)."""
        self.images, self.hidden_labels = images, hidden_labels

    def predict_attached(self, network: nn.Module) -> Tensor:
        """``network``'s softmax outputs (N, M) on the attached images
        (:func:`predict_probabilities`); a RuntimeError naming the objective if none are."""
        if self.images is None:
            raise RuntimeError(f"{type(self).__name__} needs attach() before training")
        probs, _ = predict_probabilities(network, self.images)
        return probs


def class_thresholds(probs: Tensor, labels: Tensor) -> Tensor:
    """Class-wise confidence thresholds on the validation set, paper 002 eq 5.

    tau_m = sum_{i : f(x_i) = m} p_m(x_i) / |{i : y_i = m}|: the summed confidence of the
    examples the model predicts as m, over the number of examples that truly are m.

    Args:
        probs: (N, M) predicted probabilities p(x_i; w^t) on the validation set.
        labels: (N,) true labels.

    Returns:
        (M,) thresholds, eq 5 as written: a class predicted more often than it occurs can
        exceed 1 (FedSEAL clips them to [0, 1], as 4.1.2 states).
    """
    num_classes = probs.shape[1]
    confidence, predicted = probs.max(dim=1)
    numerator = torch.zeros(num_classes, dtype=probs.dtype).index_add_(0, predicted, confidence)
    counts = torch.bincount(labels, minlength=num_classes).to(probs.dtype)
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"the validation set has no example of classes {missing}")
    return numerator / counts


def self_ensemble(previous: Tensor | None, probs: Tensor, t: int) -> Tensor:
    """pbar^t = (t - 1)/t * pbar^(t-1) + 1/t * p(x; w^t), paper 002 eq 8 (the mean of eq 7).

    Args:
        previous: (N, M) pbar^(t-1), or None when t == 1.
        probs: (N, M) the current model's probabilities.
        t: how many models the mean holds after this update (>= 1).
    """
    if t < 1 or (previous is None) != (t == 1):
        raise ValueError(f"t={t} does not match previous={'None' if previous is None else 'set'}")
    if previous is None:
        return probs.clone()
    return (t - 1) / t * previous + probs / t


def positive_negative_sets(
    pbar: Tensor, thresholds: Tensor, theta: float, negative_learning: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """The positive and complementary sets of paper 002 eqs 9-12.

    y+ = argmax_m pbar_m (eq 9); positive if pbar_{y+} >= tau_{y+} (eq 10). An example not in
    the positive set with some class m where pbar_m <= theta is negative; its complementary
    label y- is drawn uniformly from those classes (eqs 11-12) with the global torch RNG.

    Args:
        pbar: (N, M) self-ensemble probabilities.
        thresholds: (M,) class-wise thresholds tau.
        theta: the complementary threshold (paper 002: 0.05).
        negative_learning: False leaves the negative set empty (the ablation without
            complementary negative learning, 5.2.3); the positive set is unchanged.

    Returns:
        (pseudo (N,) int64, positive (N,) bool, complementary (N,) int64 with -1 where the
        example is not in the negative set).
    """
    confidence, pseudo = pbar.max(dim=1)
    positive = confidence >= thresholds.to(pbar.dtype)[pseudo]
    candidates = pbar <= theta  # (N, M)
    negative = ~positive & candidates.any(dim=1) & negative_learning
    complementary = torch.full_like(pseudo, -1)
    if negative.any():
        weights = candidates[negative].float()
        complementary[negative] = torch.multinomial(weights, 1).squeeze(1)
    return pseudo, positive, complementary


def complementary_loss(logits: Tensor, complementary: Tensor) -> Tensor:
    """-log(1 - p_{y-}(x)) per example, paper 002 eq 15; (B, M), (B,) -> (B,).

    Stable at both ends: -log1p(-p) where p < 1/2, and logsumexp over all classes minus
    logsumexp over the other classes where p is close to 1. Each branch is finite where the
    other is chosen too, so the gradient of the unchosen one (0 x it) is never NaN.
    """
    logits = logits.float()
    classes = torch.arange(logits.shape[1], device=logits.device)
    own = complementary[:, None] == classes  # one-hot (F.one_hot would sync on its range)
    log_p = logits.log_softmax(dim=1).gather(1, complementary[:, None]).squeeze(1)
    others = torch.logsumexp(logits.masked_fill(own, float("-inf")), dim=1)
    confident = torch.logsumexp(logits, dim=1) - others
    half = math.log(0.5)
    small = -torch.log1p(-log_p.clamp(max=half).exp())
    return torch.where(log_p < half, small, confident)


@dataclass(frozen=True)
class FedSEALLoss:
    """FedSEAL's client-loss hyperparameters, validated here once.

    Args:
        theta: the complementary threshold (eq 12; paper: 0.05).
        lambda_max: the positive-loss weight once ramped up (eq 13).
        ramp: the fraction of the run lambda ramps up over (0: lambda_max from round 1).
        negative_learning: False: no complementary set, L = lambda L+ (the ablation of 5.2.3).
        fixed_tau: None: the class-wise thresholds of eq 5, measured each round; a number in
            (0, 1]: that threshold for every class in every round (the constant, class-blind
            threshold of 5.2.4's comparison, as FixMatch's).
    """

    theta: float = 0.05
    lambda_max: float = 1.0
    ramp: float = 0.25
    negative_learning: bool = True
    fixed_tau: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.theta < 1:
            raise ValueError(f"loss.theta must be in [0, 1), got {self.theta}")
        if not (math.isfinite(self.lambda_max) and self.lambda_max > 0):
            raise ValueError(f"loss.lambda_max must be finite and > 0, got {self.lambda_max}")
        if not 0 <= self.ramp <= 1:
            raise ValueError(f"loss.ramp must be in [0, 1], got {self.ramp}")
        if not isinstance(self.negative_learning, bool):
            raise ValueError(
                f"loss.negative_learning must be true or false, got {self.negative_learning!r}"
            )
        if self.fixed_tau is not None and not 0 < self.fixed_tau <= 1:  # False for NaN too
            raise ValueError(f"loss.fixed_tau must be null or in (0, 1], got {self.fixed_tau}")

    def weight(self, progress: float) -> float:
        """lambda_t = lambda_max x a Gaussian ramp-up over the first ``ramp`` of the run, at
        the fraction ``progress`` of the run (round t of R: t / R)."""
        return self.lambda_max * gaussian_rampup(progress, self.ramp)


class FedSEALClient(AttachedImages, Objective):
    """FedSEAL's client objective, paper 002 eqs 13-15: L = lambda L+ + L-.

    Before training (:meth:`before_fit`) the received model w^t predicts every example of
    the client's data (un-augmented, eval mode); the predictions enter the client's running
    self-ensemble (eq 8) and give the positive and negative sets. Each batch then adds
    lambda x the mean CE(y+, f(A(x))) over its positive examples (eq 14) and the mean
    -log(1 - p_{y-}(f(x))) over its negative examples (eq 15).

    Batches: (index (B,), plain x (B, C, H, W), strong A(x) (B, C, H, W)), index being the
    example's position in the client's data.

    Args:
        thresholds: (M,) class-wise thresholds from the server (eq 5).
        lam: the positive-loss weight lambda this round (:meth:`FedSEALLoss.weight`).
        loss: theta (the complementary threshold) and whether the negative set is built, as
            :class:`FedSEALLoss`.
        ensemble: the client's (pbar (N, M), t) from earlier rounds, or None.
    """

    def __init__(
        self,
        network: Classifier,
        lr: float,
        thresholds: Tensor,
        lam: float,
        loss: FedSEALLoss = FedSEALLoss(),
        ensemble: tuple[Tensor, int] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(network, lr, **kw)
        self.thresholds, self.lam, self.loss = thresholds, lam, loss
        # lambda as a tensor the step reads (Objective.step_input): a new lambda each round
        # neither recompiles a compiled step nor re-records its CUDA graphs
        self.lam_tensor = torch.tensor(lam, dtype=torch.float32)
        self.previous = ensemble
        self.ensemble: tuple[Tensor, int] | None = None
        # the client's sets over its examples, set as training starts (step_input)
        self.pseudo = self.complementary = torch.empty(0, dtype=torch.long)
        self.positive = self.negative = torch.empty(0)

    def before_fit(self) -> None:
        probs = self.predict_attached(self.network)
        previous, t = self.previous if self.previous is not None else (None, 0)
        if previous is not None and previous.shape != probs.shape:
            raise ValueError(
                f"the client's self-ensemble has shape {tuple(previous.shape)}, its data "
                f"{tuple(probs.shape)}: the client's data changed between rounds"
            )
        pbar = self_ensemble(previous, probs, t + 1)
        self.ensemble = (pbar, t + 1)
        pseudo, positive, complementary = positive_negative_sets(
            pbar, self.thresholds, self.loss.theta, self.loss.negative_learning
        )
        # what the step reads, per example: its pseudo-label, its weight in L+ and in L- (1 in
        # the set, else 0) and its complementary label (0 outside the negative set, where its
        # weight is 0): made once a fit, not cast and masked every step
        self.step_input("pseudo", pseudo)
        self.step_input("positive", positive.float())
        self.step_input("negative", (complementary >= 0).float())
        self.step_input("complementary", complementary.clamp(min=0))
        self.step_input("lam_tensor", self.lam_tensor)
        self._log_sets(pseudo, positive, complementary)

    def _log_sets(self, pseudo: Tensor, positive: Tensor, complementary: Tensor) -> None:
        """The sets' fractions of the client's examples and, with the hidden labels, each
        set's accuracy: (right in the set) / (the set's size). Every count in one read; each
        fraction the float32 mean of the set's 0/1 values would give (count / size, rounded
        once: a float64 quotient of two such counts rounds to the same float32)."""
        negative = complementary >= 0
        sets = [positive, negative]
        y = self.hidden_labels
        if y is not None:
            sets += [(pseudo == y) & positive, (complementary != y) & negative]
        counts = torch.stack(sets).sum(1).tolist()

        def fraction(count: int, size: int) -> Tensor:
            return torch.tensor(count / size if size else math.nan, dtype=torch.float32)

        n = len(pseudo)
        self.accumulate(
            float(n),
            **{
                "pseudo/pos_frac": fraction(counts[0], n),
                "pseudo/neg_frac": fraction(counts[1], n),
            },
        )
        if y is None:
            return
        n_pos, n_neg = counts[0], counts[1]
        if n_pos:
            self.accumulate(float(n_pos), **{"pseudo/pos_acc": fraction(counts[2], n_pos)})
        if n_neg:
            self.accumulate(float(n_neg), **{"pseudo/neg_acc": fraction(counts[3], n_neg)})

    def step(self, batch: tuple[Tensor, Tensor, Tensor]) -> Step:
        index, plain, strong = batch
        logits_plain, logits_strong = self.network(torch.cat([plain, strong])).chunk(2)
        # the batch's rows of each per-example tensor (index_select: the values of [index], at
        # half its host time)
        pseudo = self.pseudo.index_select(0, index)
        positive = self.positive.index_select(0, index)
        negative = self.negative.index_select(0, index)
        complementary = self.complementary.index_select(0, index)
        # Each mean over its set by masking, 0 for an empty set: the step never reads a
        # tensor back or changes shape with the sets (a batch with no positive or no negative
        # example gets 0 for that term).
        ce = F.cross_entropy(logits_strong.float(), pseudo, reduction="none")
        loss_pos = (ce * positive).sum() / positive.sum().clamp(min=1.0)
        per_example = complementary_loss(logits_plain, complementary)
        loss_neg = (per_example * negative).sum() / negative.sum().clamp(min=1.0)
        loss = self.lam_tensor * loss_pos + loss_neg
        return loss, ((len(index), {"loss": loss, "loss_pos": loss_pos, "loss_neg": loss_neg}),)
