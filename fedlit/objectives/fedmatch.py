"""FedMatch's losses (Jeong et al., ICLR 2021, "Federated Semi-Supervised Learning with
Inter-Client Consistency & Disjoint Learning", arXiv:2006.12097), labels at the server.

The parameters are decomposed, theta = sigma + psi (section "Parameter Decomposition for
Disjoint Learning"): the server trains sigma on its labels with psi frozen,

    L_s(sigma) = lambda_s CE(y, p_{sigma + psi*}(y | x)),

and the clients train psi on their unlabeled images with sigma frozen,

    L_u(psi) = lambda_ICCS Phi_{sigma* + psi}(.) + lambda_L2 ||sigma* - psi||_2^2
               + lambda_L1 ||psi||_1,

where Phi (section "Inter-Client Consistency Loss") is the agreement-based pseudo-label's
cross-entropy on the RandAugment view pi(u) plus the inter-client consistency
(1/H) sum_j KL(p*_{h_j}(y | u) || p_theta(y | u)) with H frozen helper models. The reference code
(wyjeong/FedMatch, ``models/fedmatch/client.py``) weighs Phi's two terms separately (lambda_a,
lambda_i) and takes both on the examples whose local prediction is confident only; fedlit
follows the code there (:func:`fedmatch_unlabeled_loss`).

The paper's equations are cited by their symbols and by the titles of the subsections of its
section 4 that define them (ICLR 2021 version; arXiv v1 chose helpers differently).

The decomposition is torch's ``parametrize``: each parameter of a :class:`Classifier` becomes
``original + psi`` (:func:`decompose`), so an objective's network stays a ``Classifier`` and its
optimiser trains whichever half requires a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightly.models.utils import deactivate_requires_grad
from torch import Tensor, nn
from torch.nn.utils import parametrize

from fedlit.models import Classifier
from fedlit.objectives.base import Hits, Objective, Step

# --- the decomposition theta = sigma + psi -------------------------------------------------


class AddPsi(nn.Module):
    """The parametrisation of one parameter: theta = sigma + psi, sigma being torch's
    ``original`` and psi this module's parameter (same shape and memory layout)."""

    def __init__(self, psi: Tensor) -> None:
        super().__init__()
        self.psi = nn.Parameter(psi)

    def forward(self, sigma: Tensor) -> Tensor:
        return sigma + self.psi


def decompose(
    network: Classifier, psi: dict[str, Tensor], trained: Literal["sigma", "psi"]
) -> Classifier:
    """Make every parameter of ``network`` (its value is sigma) sigma + ``psi[name]``, in
    place, and let only the ``trained`` half require a gradient (the other is frozen: psi* at
    the server, sigma* at a client). ``psi`` maps the names of ``network.named_parameters()``
    to tensors of their shapes. Returns ``network``."""
    for name in [n for n, _ in network.named_parameters()]:
        module_name, _, attr = name.rpartition(".")
        module = network.get_submodule(module_name)
        sigma = getattr(module, attr)
        with torch.no_grad():
            value = torch.empty_like(sigma).copy_(psi[name])  # sigma's (channels-last) layout
        parametrize.register_parametrization(module, attr, AddPsi(value))
    for sigma, value in decomposed_parameters(network).values():
        sigma.requires_grad_(trained == "sigma")
        value.requires_grad_(trained == "psi")
    return network


def decomposed_parameters(network: nn.Module) -> dict[str, tuple[Tensor, Tensor]]:
    """(sigma, psi) of each parameter of a :func:`decompose`-d network, by the parameter's
    name in the undecomposed network, in ``named_parameters()`` order."""
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for module_name, module in network.named_modules():
        if not parametrize.is_parametrized(module):
            continue
        for attr, plist in module.parametrizations.items():
            name = f"{module_name}.{attr}" if module_name else attr
            out[name] = (plist.original, plist[0].psi)
    return out


def decomposition_penalty(
    sigma: Sequence[Tensor], psi: Sequence[Tensor], lambda_l1: float, lambda_l2: float
) -> Tensor:
    """lambda_L2 ||sigma* - psi||_2^2 + lambda_L1 ||psi||_1, summed over every decomposed
    tensor (FedMatch's L_u(psi), "Parameter Decomposition for Disjoint Learning"; the reference
    code's ``loss_fn_u`` sums them the same way, unnormalised). No gradient reaches sigma*."""
    l1 = torch.stack([p.float().abs().sum() for p in psi]).sum()
    l2 = torch.stack(
        [(s.detach().float() - p.float()).pow(2).sum() for s, p in zip(sigma, psi, strict=True)]
    )
    return lambda_l2 * l2.sum() + lambda_l1 * l1


# --- Phi: agreement-based pseudo-labels and inter-client consistency ------------------------


def agreement_pseudo_labels(logits: Tensor, helper_logits: Sequence[Tensor]) -> Tensor:
    """y_hat = Max(1(p_theta(y|u)) + sum_j 1(p*_{h_j}(y|u))): every model votes for its argmax
    class and the class with most votes wins, ties going to the lowest class index (the
    reference code's ``np.argmax`` of the vote counts; with one local model and two helpers a
    three-way split is such a tie).

    Args:
        logits: (B, K) the client's model on the un-augmented images u.
        helper_logits: H tensors (B, K), the helpers' on the same images.

    Returns:
        (B,) int64 pseudo-labels.
    """
    classes = torch.arange(logits.shape[-1], device=logits.device)
    # one-hot votes by comparison (F.one_hot reads the labels' range back: a host sync)
    votes = (logits.argmax(-1, keepdim=True) == classes).long()
    for helper in helper_logits:
        votes = votes + (helper.argmax(-1, keepdim=True) == classes).long()
    return votes.argmax(-1)  # the first of equal maxima


def inter_client_consistency(logits: Tensor, helper_logits: Sequence[Tensor]) -> Tensor:
    """(1/H) sum_j KL(p*_{h_j}(y|u) || p_theta(y|u)) per example: the helpers' predictions are
    the (frozen) targets, the client's model is pulled towards them (the KL's direction as in
    the paper and in the code's ``KLDivergence()(helper, local)``).

    Args:
        logits: (B, K) the client's model on u; the gradient flows through them.
        helper_logits: H tensors (B, K) of the helpers (no gradient).

    Returns:
        (B,) the per-example term; zeros when H = 0.
    """
    if not helper_logits:
        return logits.new_zeros(logits.shape[0], dtype=torch.float32)
    log_p = logits.float().log_softmax(-1)
    terms = []
    for helper in helper_logits:
        log_q = helper.detach().float().log_softmax(-1)
        terms.append((log_q.exp() * (log_q - log_p)).sum(-1))
    return torch.stack(terms).mean(0)


def fedmatch_unlabeled_loss(
    logits_plain: Tensor,
    logits_strong: Tensor,
    helper_logits: Sequence[Tensor],
    tau: float,
    lambda_i: float,
    lambda_a: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """FedMatch's Phi as the reference code computes it (``loss_fn_u``).

    The confident examples are those whose local prediction on u has max_y p_theta(y|u) >= tau
    (only the local model is thresholded; the helpers then vote unconditionally). Over them:

        lambda_i (1/H) sum_j KL(p*_{h_j}(y|u) || p_theta(y|u))
        + lambda_a CE(y_hat, p_theta(y | pi(u))),

    each a mean over the confident examples (0 when there is none; the gradient still flows,
    as zeros), y_hat from :func:`agreement_pseudo_labels`.

    Args:
        logits_plain: (B, K) the client's model on the un-augmented images u.
        logits_strong: (B, K) the client's model on their RandAugment views pi(u).
        helper_logits: H tensors (B, K), the helpers on u (H may be 0).
        tau: the confidence threshold.
        lambda_i, lambda_a: the weights of the consistency and of the pseudo-label CE.

    Returns:
        (loss, consistency, agreement_ce, mask (B,) float, pseudo (B,) int64).
    """
    detached = logits_plain.detach()
    mask = (detached.float().softmax(-1).max(-1).values >= tau).float()
    pseudo = agreement_pseudo_labels(detached, helper_logits)
    count = mask.sum().clamp(min=1.0)
    consistency = (inter_client_consistency(logits_plain, helper_logits) * mask).sum() / count
    per_example = F.cross_entropy(logits_strong.float(), pseudo, reduction="none")
    agreement = (per_example * mask).sum() / count
    return lambda_i * consistency + lambda_a * agreement, consistency, agreement, mask, pseudo


@dataclass(frozen=True)
class FedMatchLoss:
    """FedMatch's client-loss hyperparameters, validated here once. Defaults: the reference
    code's labels-at-server configuration (``config.py``).

    Args:
        tau: the confidence threshold on the local model's prediction (code: 0.75).
        lambda_i: weight of the inter-client consistency (code: 1e-2).
        lambda_a: weight of the agreement-based pseudo-label CE (code: 1e-2). The paper's
            lambda_ICCS weighs both terms of Phi: lambda_i = lambda_a = lambda_ICCS.
        lambda_l1: weight of ||psi||_1 (code: 1e-5).
        lambda_l2: weight of ||sigma* - psi||_2^2 (code: 10).
    """

    tau: float = 0.75
    lambda_i: float = 1e-2
    lambda_a: float = 1e-2
    lambda_l1: float = 1e-5
    lambda_l2: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.tau <= 1.0:  # False for NaN too
            raise ValueError(f"loss.tau must be in [0, 1], got {self.tau}")
        for key in ("lambda_i", "lambda_a", "lambda_l1", "lambda_l2"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"loss.{key} must be finite and >= 0, got {value}")


# --- the objectives ----------------------------------------------------------------------


class FedMatchServer(Objective):
    """The server's L_s(sigma) = lambda_s CE(y, p_{sigma + psi*}(y | x)).

    ``network`` is :func:`decompose`-d with sigma trained and psi* (the global psi) frozen.
    Batches: (x (B, C, H, W), y (B,) int64).
    """

    def __init__(self, network: Classifier, lr: float, lambda_s: float = 10.0, **kw: Any) -> None:
        super().__init__(network, lr, **kw)
        self.lambda_s = lambda_s

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        x, y = batch
        logits = self.network(x)
        ce = F.cross_entropy(logits.float(), y)
        loss = self.lambda_s * ce
        return loss, ((len(y), {"loss": loss, "ce": ce, "acc": Hits(logits, y)}),)


class FedMatchClient(Objective):
    """A client's L_u(psi): Phi (:func:`fedmatch_unlabeled_loss`) on the client's model
    theta = sigma* + psi and its helpers, plus :func:`decomposition_penalty`.

    ``network`` is :func:`decompose`-d with psi trained and sigma* frozen; ``helpers`` are the
    H networks sigma* + psi_{h_j} it received this round (possibly none), frozen. They predict
    u in the objective's mode, as the client's model does (in training: BatchNorm on the
    batch's statistics; the reference ResNet-9 has no normalisation layers).

    Per batch it records ``loss``, ``loss_u`` (Phi), ``consistency``, ``agreement`` (the CE),
    ``penalty``, ``mask_rate`` (confident fraction) and ``helpers`` (H).

    Batches: (u (B, C, H, W) un-augmented, pi(u) (B, C, H, W) RandAugment views).

    Args:
        received: the psi the client received, flat (P,) on the CPU; kept for the upload
            (what changed is what is sent).
        loss: tau and the lambdas (:class:`FedMatchLoss`).
    """

    def __init__(
        self,
        network: Classifier,
        lr: float,
        helpers: Sequence[Classifier],
        received: Tensor,
        loss: FedMatchLoss = FedMatchLoss(),
        **kw: Any,
    ) -> None:
        super().__init__(network, lr, **kw)
        for helper in helpers:
            deactivate_requires_grad(helper)
        self.helpers = nn.ModuleList(helpers)
        self.received = received
        self.loss = loss

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        plain, strong = batch
        cfg = self.loss
        logits_plain, logits_strong = self.network(plain), self.network(strong)
        with torch.no_grad():
            helper_logits = [helper(plain) for helper in self.helpers]
        loss_u, consistency, agreement, mask, _ = fedmatch_unlabeled_loss(
            logits_plain, logits_strong, helper_logits, cfg.tau, cfg.lambda_i, cfg.lambda_a
        )
        pairs = list(decomposed_parameters(self.network).values())
        penalty = decomposition_penalty(
            [s for s, _ in pairs], [p for _, p in pairs], cfg.lambda_l1, cfg.lambda_l2
        )
        loss = loss_u + penalty
        per_example: dict[str, Tensor | float] = {
            "loss": loss,
            "loss_u": loss_u,
            "consistency": consistency,
            "agreement": agreement,
            "mask_rate": mask.mean(),
        }
        per_step: dict[str, Tensor | float] = {
            "penalty": penalty,
            "helpers": float(len(self.helpers)),
        }
        return loss, ((len(plain), per_example), (1.0, per_step))

    def psi(self) -> dict[str, Tensor]:
        """The trained psi, by parameter name (detached)."""
        return {name: p.detach() for name, (_, p) in decomposed_parameters(self.network).items()}
