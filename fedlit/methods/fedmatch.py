"""FedMatch (Jeong et al., ICLR 2021, arXiv:2006.12097), labels at the server; not private."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlit.aggregation import Aggregated, Mean
from fedlit.aggregation.payloads import state_part
from fedlit.data.augment import batch_view
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.datasets import DatasetSpec
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.methods.base import (
    DEFAULT_OPTIMIZATION,
    FederatedMethod,
    Payload,
    StateDict,
    classifier_part,
    seed_classifier,
)
from fedlit.methods.client_side import ClientSetup, ClientSide, ClientUpdate
from fedlit.models import Architecture, Backbone, Classifier
from fedlit.objectives import (
    FedMatchClient,
    FedMatchLoss,
    FedMatchServer,
    Objective,
    Optimization,
)
from fedlit.objectives.fedmatch import decompose, decomposed_parameters
from fedlit.search_space import CLIENT_SPACE

if TYPE_CHECKING:
    from fedlit.federation.config import FederationConfig

SIGMA = "sigma"  # down: sigma and the network's buffers, dense
PSI = "psi"  # down: the global psi, sparse
# up: the entries of psi a client changed, sparse; named apart from PSI because the driver's
# weight diversity pairs received and uploaded tensors by name, and sparse parts differ in size
UPDATE = "psi_update"


def helper_part(j: int) -> str:
    """The payload part of the j-th helper's psi (sparse)."""
    return f"helper{j}"


# --- flat psi <-> parameters ------------------------------------------------------------


@dataclass(frozen=True)
class ParameterLayout:
    """The parameters of a network as one flat vector: (name, shape, numel) of each, in
    ``named_parameters()`` order."""

    entries: tuple[tuple[str, torch.Size, int], ...]

    @classmethod
    def of(cls, network: nn.Module) -> ParameterLayout:
        """The layout of ``network``'s parameters."""
        return cls(tuple((n, p.shape, p.numel()) for n, p in network.named_parameters()))

    @property
    def size(self) -> int:
        """P, the number of entries of the flat vector."""
        return sum(numel for _, _, numel in self.entries)

    def flatten(self, tensors: Mapping[str, Tensor]) -> Tensor:
        """Tensors by parameter name -> one flat float32 (P,) vector on the CPU."""
        return torch.cat(
            [tensors[n].detach().reshape(-1).float().cpu() for n, _, _ in self.entries]
        )

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """A flat (P,) vector -> tensors by parameter name, of the parameters' shapes."""
        out, offset = {}, 0
        for name, shape, numel in self.entries:
            out[name] = flat[offset : offset + numel].view(shape)
            offset += numel
        return out

    def with_psi(self, network: Classifier, psi: Tensor) -> Classifier:
        """``network`` (holding sigma) with psi added to its parameters, in place: theta."""
        parts = self.unflatten(psi)
        with torch.no_grad():
            for name, param in network.named_parameters():
                param.add_(parts[name].to(param.device))
        return network


# --- psi on the wire ----------------------------------------------------------------------


def sparsify(psi: Tensor, threshold: float) -> Tensor:
    """psi with the entries of magnitude <= ``threshold`` set to 0 (the code's ``l1_thres``)."""
    return torch.where(psi.abs() > threshold, psi, torch.zeros_like(psi))


def encode_sparse(values: Tensor, keep: Tensor) -> StateDict:
    """The entries ``keep`` (P,) bool of ``values`` (P,) float32 as they travel:
    ``{"indices": int32 (k,), "values": float32 (k,)}``, 8 bytes an entry, or, where that is
    not smaller than the dense vector (2k >= P), ``{"values": values}``, 4P bytes. Either
    decodes (:func:`decode_sparse`) onto the receiver's copy to the same vector."""
    index = keep.nonzero().flatten()
    if 2 * len(index) >= len(values):
        return {"values": values.detach().float().clone()}
    return {"indices": index.to(torch.int32), "values": values[index].detach().float().clone()}


def decode_sparse(part: Mapping[str, Tensor], base: Tensor) -> Tensor:
    """``base`` (P,) with the part's entries written in (a dense part replaces it)."""
    if "indices" not in part:
        return part["values"].clone()
    out = base.clone()
    out[part["indices"].long()] = part["values"]
    return out


# --- helper selection -----------------------------------------------------------------------


def probe_images(spec: DatasetSpec, count: int = 1, seed: int = 0) -> Tensor:
    """The fixed random input the server embeds models with: ``count`` images of truncated
    Gaussian noise (pixel mean 125, std 125, in [0, 255], as the reference code's ``rgauss``),
    drawn from a generator seeded with ``seed``, rounded to uint8 and given the data set's
    plain view (its normalisation): (count, C, S, S) float32."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.empty(count, spec.channels, spec.size, spec.size)
    torch.nn.init.trunc_normal_(noise, 125.0, 125.0, 0.0, 255.0, generator=generator)
    return batch_view("plain", spec)(noise.round().to(torch.uint8))


@torch.no_grad()
def model_embedding(network: nn.Module, probe: Tensor) -> Tensor:
    """A model's embedding: its softmax on the probe images, (count * K,) float64, in eval
    mode (the reference code's ``np.squeeze(model(rgauss))``)."""
    was_training = network.training
    network.eval()
    embedding = network(probe).double().softmax(-1).flatten()
    network.train(was_training)
    return embedding


def nearest_helpers(embeddings: Mapping[int, Tensor], client_id: int, count: int) -> list[int]:
    """The ``count`` clients (other than ``client_id``) whose embeddings are nearest, in
    Euclidean distance, to ``client_id``'s, nearest first, ties to the lower client id; fewer
    where fewer others are known. The reference code queries a KD-tree for the H + 1 nearest
    and drops the client itself: the same clients but for ties."""
    others = sorted(k for k in embeddings if k != client_id)
    if count == 0 or not others:
        return []
    query = embeddings[client_id].double()
    distance = [float(torch.linalg.vector_norm(embeddings[k].double() - query)) for k in others]
    ranked = sorted(range(len(others)), key=lambda i: (distance[i], others[i]))
    return [others[i] for i in ranked[:count]]


# --- the method ---------------------------------------------------------------------------


class FedMatch(FederatedMethod):
    """FedMatch (Jeong et al., ICLR 2021), labels-at-server, as papers 002 and 003 run it.
    NOT PRIVATE: each client receives other clients' models (its helpers), which standard
    federated learning forbids (paper 003 section 3.1); ``private = False`` marks it.

    **Disjoint learning.** theta = sigma + psi ("Parameter Decomposition for Disjoint
    Learning"). The global network ``self.network`` holds sigma (and the BatchNorm statistics);
    the global psi is the buffer ``psi``, flat (P,) in ``named_parameters()`` order. Each
    round the server first trains sigma with psi* frozen, L_s(sigma) = lambda_s CE(y,
    p_{sigma + psi*}(y | x)), on un-augmented labeled images (``server_augment: false``, as the
    code's server; paper 002 5.2.2 notes FedMatch uses no augmentation at the server); the
    clients then train psi with sigma* frozen, L_u(psi) = Phi + lambda_L2 ||sigma* - psi||^2 +
    lambda_L1 ||psi||_1 (:class:`~fedlit.objectives.FedMatchClient`); the server averages their
    psi (plain mean, the code's ``uniform_average``). The scored network is sigma + psi.

    **Inter-client consistency.** After aggregation the server embeds each uploaded model
    sigma + psi_k by its softmax on a fixed noise image (:func:`probe_images`,
    :func:`model_embedding`) and keeps, for every client that has uploaded, its latest psi and
    embedding (the code's ``cid_to_weights`` / ``cid_to_vectors``: module extra state). In the
    rounds t with t % ``helper_interval`` == 0 a sampled client that has an embedding receives
    the psi of the H clients nearest to it (:func:`nearest_helpers`) as ``helper0``,
    ``helper1``, ...; it builds each helper as sigma* + psi_{h_j}. Phi is the agreement
    pseudo-label's CE on RandAugment views plus (1/H) sum_j KL(p*_{h_j}(y|u) || p_theta(y|u))
    (:func:`~fedlit.objectives.fedmatch.fedmatch_unlabeled_loss`); without helpers it is the
    pseudo-label CE alone, the label being the local model's argmax.

    **What travels** (``comm/bytes_down/<part>``, ``comm/bytes_up/<part>``). Down: ``sigma``
    dense with the buffers; ``psi``, the global psi's non-zero entries (it is kept sparse:
    entries with |psi| <= ``l1_threshold`` are 0) with int32 indices, 8 bytes an entry; each
    helper's psi likewise. Up: ``psi_update``, the entries where the client's psi, sparsified,
    differs from the psi it received by more than ``delta_threshold``, with their indices; the
    server writes them into the psi it sent (:func:`encode_sparse`). A part whose entries
    would cost more than its dense vector travels dense (4 bytes an entry). A client uploads
    no BatchNorm statistics. ``diag/weight_diversity`` is NaN: the sparse parts are not
    weight vectors.

    **Where the reference code and the paper differ, and what fedlit follows.**

    * Helper schedule: the paper (ICLR version; arXiv v1 picked the helpers by their
      accuracy on a validation set instead) describes the server choosing H helpers per client
      by model similarity, a KD-tree over the models' outputs on random noise, and sending
      them; the code sends them only in the rounds with (r + 1) % h_interval == 0 (r from 0,
      h_interval = 10) and trains the other rounds without consistency term and with the
      local model's own vote. fedlit follows the code (``helper_interval: 10``);
      ``helper_interval: 1`` sends them every round. Exact nearest neighbours replace the
      KD-tree (the same clients up to ties).
    * Which examples count: the paper writes y_hat = Max(1(p_theta) + sum_j 1(p*_{h_j})) and
      discards low-confidence instances (below tau) without saying whose confidence; the code
      thresholds the local model's only (tau = 0.75), lets every helper vote by its argmax,
      and takes both the consistency and the CE over the confident examples. fedlit follows
      the code.
    * Weights of Phi: the paper's lambda_ICCS weighs Phi; the code weighs its KL (lambda_i)
      and its CE (lambda_a) separately, both 1e-2. fedlit follows the code.
    * Communication: the paper lowers the cost by psi's sparsity (its L1 term) and by
      sending what changed; the code counts, but does not transfer, the entries that changed
      by more than delta_thres after zeroing |psi| <= l1_thres, against each client's stale
      copy kept between its rounds (also for sigma). fedlit keeps no per-client copies
      (clients are stateless): sigma goes dense, psi and the helpers as their non-zero
      entries, uploads as their changed entries. The code applies l1_thres to psi only at
      inference and in that count; fedlit keeps the global psi sparsified, so the server
      trains, sends and scores the same sparse psi.
    * Not in the paper, from the code: psi starts as ``psi_factor`` (0.2) x sigma's
      initialisation; lambda_s = 10; labels-at-server uses 100 labels per class (1,000 in
      all), where the paper states 5,000 (papers 002 and 003).
    * fedlit's networks have biases and normalisation layers the code's ResNet-9 lacks: every
      parameter is decomposed; the BatchNorm statistics are the server's (sent with sigma,
      not uploaded), and helpers normalise u with its batch statistics as the client's model
      does.

    Memory: the server keeps the latest psi of every client that has uploaded (as sent: sparse
    or dense), up to P floats a client (ResNet-9: 26 MB, so 2.6 GB for 100 clients).

    Args:
        loss: tau and the client loss's lambdas (:class:`~fedlit.objectives.FedMatchLoss`).
        num_helpers: H, helpers per client (paper and code: 2).
        helper_interval: helpers are sent in the rounds t with t % helper_interval == 0
            (code: 10).
        lambda_s: weight of the server's CE (code: 10).
        psi_factor: psi's initial value as a multiple of sigma's (code: 0.2).
        l1_threshold: |psi| at or below it counts as 0 (code's l1_thres, labels-at-server:
            1e-5).
        delta_threshold: an upload sends the entries that changed by more (code's
            delta_thres: 1e-5).
        server_augment: the server trains on weak views instead of un-augmented images.
        The others: see :class:`FederatedMethod`.
    """

    search_space = CLIENT_SPACE

    private = False

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FedMatchLoss = FedMatchLoss(),
        num_helpers: int = 2,
        helper_interval: int = 10,
        lambda_s: float = 10.0,
        psi_factor: float = 0.2,
        l1_threshold: float = 1e-5,
        delta_threshold: float = 1e-5,
        server_augment: bool = False,
    ) -> None:
        if num_helpers < 0:
            raise ValueError(f"model.num_helpers must be >= 0, got {num_helpers}")
        if helper_interval < 1:
            raise ValueError(f"model.helper_interval must be >= 1, got {helper_interval}")
        for key, value in (
            ("lambda_s", lambda_s),
            ("psi_factor", psi_factor),
            ("l1_threshold", l1_threshold),
            ("delta_threshold", delta_threshold),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model.{key} must be finite and >= 0, got {value}")
        super().__init__(network, optim)
        self.loss = loss
        self.num_helpers, self.helper_interval = num_helpers, helper_interval
        self.lambda_s, self.psi_factor = lambda_s, psi_factor
        self.l1_threshold, self.delta_threshold = l1_threshold, delta_threshold
        self.server_augment = server_augment
        self.aggregator = Mean()  # the code's uniform_average of psi
        self.layout = ParameterLayout.of(self.network)
        self.psi: Tensor
        self.register_buffer("psi", torch.zeros(self.layout.size))
        #: each client's latest psi (as sent) and embedding, for the clients that uploaded
        self.client_psi: dict[int, StateDict] = {}
        self.embeddings: dict[int, Tensor] = {}
        #: the fixed noise input of the embeddings (:meth:`validate_data`)
        self.probe: Tensor | None = None

    def theta(self, psi: Tensor) -> Classifier:
        """A new network sigma + ``psi`` with the global network's buffers."""
        return self.layout.with_psi(copy.deepcopy(self.network), psi)

    # --- state ----------------------------------------------------------------------------
    def initialize(self) -> None:
        super().initialize()
        sigma = self.layout.flatten(dict(self.network.named_parameters()))
        self.psi.copy_(sparsify(self.psi_factor * sigma, self.l1_threshold))
        self.client_psi, self.embeddings = {}, {}

    @classmethod
    def scored_state(cls, method_state: StateDict, template: Classifier) -> StateDict:
        """theta = sigma + psi, the network FedMatch scores: the global network's (sigma's)
        state with the flat ``psi`` added to its parameters (``template``'s order)."""
        sigma = classifier_part(method_state, "network.", template)
        layout = ParameterLayout.of(template)
        psi = method_state["psi"]
        if psi.shape != (layout.size,):
            raise ValueError(f"psi has {psi.numel()} entries, this network {layout.size}")
        parts = layout.unflatten(psi)
        return {k: v + parts[k].to(v) if k in parts else v for k, v in sigma.items()}

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """theta = sigma + psi takes the source's network w, split as at a fresh start:
        psi = psi_factor x sigma (sparsified, as the global psi always is), so
        psi = sparsify(psi_factor / (1 + psi_factor) x w) and sigma = w - psi; the buffers
        (BatchNorm statistics) are w's. The clients' psi and embeddings start empty."""
        seed_classifier(self.network, network)
        w = self.layout.flatten(dict(self.network.named_parameters()))
        psi = sparsify(self.psi_factor / (1 + self.psi_factor) * w, self.l1_threshold)
        sigma = self.layout.unflatten(w - psi)
        with torch.no_grad():
            for name, param in self.network.named_parameters():
                param.copy_(sigma[name])
        self.psi.copy_(psi)
        self.client_psi, self.embeddings = {}, {}

    def check_federation(self, config: FederationConfig) -> None:
        """A compiled step (``federation.compile``) is refused: every server and client step
        trains a network built for it (sigma + psi as parametrizations, which give each module
        a class of its own), so every step would be compiled anew."""
        if config.compile is not None:
            raise ValueError(
                f"federation.compile={config.compile!r}: FedMatch builds a new decomposed "
                "network (sigma + psi parametrizations) for every server and client step, so "
                "each step would be compiled anew; leave federation.compile null"
            )

    def validate_data(self, data: FederatedDataModule) -> None:
        """The base's checks, then the probe images the embeddings are taken on, of the data
        set's shape."""
        super().validate_data(data)
        self.probe = probe_images(data.spec)

    def get_extra_state(self) -> dict[str, Any]:
        return {"client_psi": self.client_psi, "embeddings": self.embeddings}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.client_psi = dict(state["client_psi"])
        self.embeddings = dict(state["embeddings"])

    # --- server ---------------------------------------------------------------------------
    def server_objective(self) -> Objective:
        network = decompose(copy.deepcopy(self.network), self.layout.unflatten(self.psi), "sigma")
        return FedMatchServer(network, lambda_s=self.lambda_s, **self._server_kwargs())

    def server_loader(self, data: FederatedDataModule) -> ImageBatches:
        return data.server_dataloader(("weak",) if self.server_augment else ("plain",))

    def server_step_done(
        self, objective: Objective, data: FederatedDataModule, device: torch.device | None = None
    ) -> None:
        """The trained sigma and the BatchNorm statistics back into ``self.network``."""
        sigma = decomposed_parameters(objective.network)
        buffers = dict(objective.network.named_buffers())
        with torch.no_grad():
            for name, param in self.network.named_parameters():
                param.copy_(sigma[name][0])
            for name, buffer in self.network.named_buffers():
                buffer.copy_(buffers[name])

    # --- communication --------------------------------------------------------------------
    def broadcast(self) -> Payload:
        sigma = {k: v.detach().clone() for k, v in self.network.state_dict().items()}
        return {SIGMA: sigma, PSI: encode_sparse(self.psi, self.psi != 0)}

    def client_payload(self, payload: Payload, client_id: int) -> Payload:
        """The broadcast, plus the psi of the H clients nearest to ``client_id`` in a helper
        round (t % helper_interval == 0) where the client has an embedding."""
        if self.round_idx % self.helper_interval or client_id not in self.embeddings:
            return payload
        helpers = nearest_helpers(self.embeddings, client_id, self.num_helpers)
        return payload | {helper_part(j): self.client_psi[h] for j, h in enumerate(helpers)}

    # --- client ---------------------------------------------------------------------------
    def client_side(self) -> FedMatchClientSide:
        return FedMatchClientSide(
            self._client_setup(),
            layout=self.layout,
            loss=self.loss,
            num_helpers=self.num_helpers,
            l1_threshold=self.l1_threshold,
            delta_threshold=self.delta_threshold,
        )

    # --- aggregation ----------------------------------------------------------------------
    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """psi = the plain mean of the clients' psi, sparsified; each client's psi and the
        embedding of sigma + psi_k kept for the helper selection."""
        if self.probe is None:
            raise RuntimeError("FedMatch.validate_data(data) sets the probe before aggregation")
        psis = [decode_sparse(state_part(u.upload, UPDATE), self.psi) for u in updates]
        for update, psi in zip(updates, psis, strict=True):
            self.client_psi[update.client_id] = encode_sparse(psi, psi != 0)
            self.embeddings[update.client_id] = model_embedding(self.theta(psi), self.probe)
        result = self.aggregator([{PSI: p} for p in psis], [u.num_examples for u in updates])
        self.psi.copy_(sparsify(result.state[PSI], self.l1_threshold))
        return result

    # --- evaluation -----------------------------------------------------------------------
    def eval_network(self) -> nn.Module:
        """theta = sigma + psi."""
        return self.theta(self.psi)

    def encoder(self) -> Backbone:
        return self.theta(self.psi).backbone


class FedMatchClientSide(ClientSide):
    """FedMatch's client: psi trained with sigma* frozen against its helpers
    (:class:`~fedlit.objectives.FedMatchClient`) on (plain, strong) views; it uploads the
    entries of psi that changed.

    Args:
        layout: the network's parameters as psi's flat vector.
        loss: tau and the client loss's lambdas (:class:`~fedlit.objectives.FedMatchLoss`).
        num_helpers: H, the most helpers a payload carries.
        l1_threshold: |psi| at or below it counts as 0.
        delta_threshold: an upload sends the entries that changed by more.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(
        self,
        setup: ClientSetup,
        layout: ParameterLayout,
        loss: FedMatchLoss,
        num_helpers: int,
        l1_threshold: float,
        delta_threshold: float,
    ) -> None:
        super().__init__(setup, ("plain", "strong"))
        self.layout, self.loss, self.num_helpers = layout, loss, num_helpers
        self.l1_threshold, self.delta_threshold = l1_threshold, delta_threshold

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        sigma = state_part(payload, SIGMA)
        zeros = torch.zeros(self.layout.size)
        psi = decode_sparse(state_part(payload, PSI), zeros)
        parts = [helper_part(j) for j in range(self.num_helpers) if helper_part(j) in payload]
        helpers = [  # each helper's persistent network: theta = sigma + its psi, in place
            self.layout.with_psi(
                self.network(sigma, h), decode_sparse(state_part(payload, h), zeros)
            )
            for h in parts
        ]
        # a new network: the decomposition changes its structure (parametrizations)
        network = decompose(self.network(sigma, None), self.layout.unflatten(psi), "psi")
        return FedMatchClient(
            network, helpers=helpers, received=psi, loss=self.loss, **self.optimizer_kwargs()
        )

    def upload(self, objective: Objective) -> Payload:
        """The entries of the client's sparsified psi that differ from the psi it received by
        more than ``delta_threshold`` (the code's C2S), with their indices."""
        assert isinstance(objective, FedMatchClient)
        received = objective.received
        trained = sparsify(self.layout.flatten(objective.psi()), self.l1_threshold)
        changed = (trained - received).abs() > self.delta_threshold
        return {UPDATE: encode_sparse(torch.where(changed, trained, received), changed)}
