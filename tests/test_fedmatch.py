"""FedMatch: its loss terms against hand / NumPy values, the agreement pseudo-label, helper
selection on known models, the bytes psi costs, a real run and an exact resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import stop_in_round, tiny_data

from fedlit.aggregation.payloads import payload_bytes, state_part
from fedlit.data import ClientData, FederatedDataModule, ImageSplit
from fedlit.data.datasets import SPECS
from fedlit.federation import Federation, FederationConfig
from fedlit.methods import ClientUpdate, FedMatch
from fedlit.methods.base import marks
from fedlit.methods.fedmatch import (
    PSI,
    SIGMA,
    UPDATE,
    decode_sparse,
    encode_sparse,
    helper_part,
    nearest_helpers,
    probe_images,
    sparsify,
)
from fedlit.models import Architecture, build_classifier
from fedlit.objectives import FedMatchClient, FedMatchLoss, FedMatchServer, Optimization
from fedlit.objectives.fedmatch import (
    agreement_pseudo_labels,
    decompose,
    decomposed_parameters,
    decomposition_penalty,
    fedmatch_unlabeled_loss,
    inter_client_consistency,
)

SPEC = SPECS["fashion_mnist"]


def _method(**kw: object) -> FedMatch:
    torch.manual_seed(0)
    method = FedMatch(Architecture(10, 1), **kw)  # type: ignore[arg-type]
    method.initialize()
    method.probe = probe_images(SPEC)
    return method


def _client(n: int = 8) -> ClientData:
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8)
    return ClientData(0, 1, ImageSplit(images, torch.zeros(n).long()), None, SPEC, n, n, n)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


# --- the loss terms ----------------------------------------------------------------------


def test_agreement_pseudo_label_on_a_hand_made_case() -> None:
    local = torch.tensor([[3.0, 1.0, 0.0], [0.0, 0.0, 5.0], [0.0, 2.0, 1.0]])
    helper_1 = torch.tensor([[0.0, 2.0, 1.0], [0.0, 4.0, 0.0], [0.0, 2.0, 3.0]])
    helper_2 = torch.tensor([[0.0, 5.0, 1.0], [4.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # row 0: votes 0, 1, 1 -> 1 (the helpers outvote the local model);
    # row 1: votes 2, 1, 0 -> a three-way tie -> the lowest class, 0 (the code's np.argmax);
    # row 2: votes 1, 2, 0 -> a three-way tie -> 0
    assert agreement_pseudo_labels(local, [helper_1, helper_2]).tolist() == [1, 0, 0]
    assert agreement_pseudo_labels(local, [helper_1]).tolist() == [0, 1, 1]  # 1-1: lowest
    assert agreement_pseudo_labels(local, []).tolist() == [0, 2, 1]  # the local argmax


def test_inter_client_consistency_is_the_mean_kl_from_the_helpers() -> None:
    gen = torch.Generator().manual_seed(0)
    local = torch.randn(4, 5, generator=gen, requires_grad=True)
    helpers = [torch.randn(4, 5, generator=gen) for _ in range(2)]
    got = inter_client_consistency(local, helpers)
    log_p = _log_softmax(local.detach().numpy())
    want = np.zeros(4)
    for h in helpers:
        log_q = _log_softmax(h.numpy())
        want += (np.exp(log_q) * (log_q - log_p)).sum(-1) / 2  # KL(q_h || p), mean over H
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5)
    got.sum().backward()
    assert local.grad is not None and local.grad.abs().sum() > 0
    assert inter_client_consistency(local, []).tolist() == [0.0] * 4


def test_unlabeled_loss_takes_the_confident_examples_only() -> None:
    plain = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.0, 5.0]], requires_grad=True)
    strong = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 1.0]], requires_grad=True)
    helpers = [torch.tensor([[0.0, 3.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])] * 2
    loss, consistency, agreement, mask, pseudo = fedmatch_unlabeled_loss(
        plain, strong, helpers, tau=0.75, lambda_i=0.5, lambda_a=2.0
    )
    assert mask.tolist() == [1.0, 0.0, 1.0]  # row 1's local prediction is not confident
    assert pseudo[[0, 2]].tolist() == [1, 2]  # row 0: the two helpers outvote the local model
    log_p, log_s = _log_softmax(plain.detach().numpy()), _log_softmax(strong.detach().numpy())
    log_q = _log_softmax(helpers[0].numpy())
    kl = (np.exp(log_q) * (log_q - log_p)).sum(-1)
    want_kl = (kl[0] + kl[2]) / 2
    want_ce = (-log_s[0, 1] - log_s[2, 2]) / 2
    np.testing.assert_allclose(consistency.item(), want_kl, rtol=1e-5)
    np.testing.assert_allclose(agreement.item(), want_ce, rtol=1e-5)
    np.testing.assert_allclose(loss.item(), 0.5 * want_kl + 2.0 * want_ce, rtol=1e-5)
    # nothing confident: zero, and still a graph (the regularisers may be 0 too)
    none, *_ = fedmatch_unlabeled_loss(plain, strong, helpers, 0.99, 1.0, 1.0)
    assert none.item() == 0.0 and none.requires_grad


def test_decomposition_penalty_against_numpy() -> None:
    sigma = [torch.tensor([[1.0, -2.0], [0.5, 0.0]]), torch.tensor([3.0])]
    psi = [torch.tensor([[0.5, 1.0], [0.0, -1.0]], requires_grad=True), torch.tensor([2.0])]
    psi[1].requires_grad_(True)
    got = decomposition_penalty(sigma, psi, lambda_l1=0.1, lambda_l2=10.0)
    s = np.concatenate([t.numpy().ravel() for t in sigma])
    p = np.concatenate([t.detach().numpy().ravel() for t in psi])
    want = 10.0 * ((s - p) ** 2).sum() + 0.1 * np.abs(p).sum()
    np.testing.assert_allclose(got.item(), want, rtol=1e-6)
    got.backward()
    want_grad = 2 * 10.0 * (p - s) + 0.1 * np.sign(p)
    np.testing.assert_allclose(torch.cat([t.grad.ravel() for t in psi]).numpy(), want_grad)


def test_fedmatch_settings_are_validated() -> None:
    """(The loss's: tests/test_objectives.py's ``BAD_SETTINGS``.)"""
    with pytest.raises(ValueError, match="model.helper_interval"):
        FedMatch(Architecture(10, 1), helper_interval=0)
    with pytest.raises(ValueError, match="model.delta_threshold"):
        FedMatch(Architecture(10, 1), delta_threshold=float("nan"))


# --- the decomposition ---------------------------------------------------------------------


def test_decomposed_network_is_sigma_plus_psi_and_trains_one_half() -> None:
    torch.manual_seed(0)
    sigma_net = build_classifier("small_cnn", 10, 1)
    psi = {n: torch.randn_like(p) * 0.1 for n, p in sigma_net.named_parameters()}
    theta = build_classifier("small_cnn", 10, 1)
    theta.load_state_dict(sigma_net.state_dict())
    with torch.no_grad():
        for n, p in theta.named_parameters():
            p.add_(psi[n])
    x = torch.randn(4, 1, 28, 28)
    decomposed = decompose(sigma_net, psi, "psi").eval()
    torch.testing.assert_close(decomposed(x), theta.eval()(x))
    pairs = decomposed_parameters(decomposed)
    assert list(pairs) == [n for n, _ in theta.named_parameters()]
    assert all(not s.requires_grad and p.requires_grad for s, p in pairs.values())


def _one_step(objective: FedMatchClient | FedMatchServer, batch: tuple) -> tuple[bool, bool]:
    """One SGD step of ``objective``: whether it changed (sigma, psi)."""
    pairs = decomposed_parameters(objective.network)
    before = {n: (s.clone(), p.clone()) for n, (s, p) in pairs.items()}
    optimizer, _ = objective.optimizer_and_scheduler(1)
    objective.training_step(batch, 0).backward()
    optimizer.step()
    after = decomposed_parameters(objective.network)
    sigma_moved = any(not torch.equal(after[n][0], s) for n, (s, _) in before.items())
    psi_moved = any(not torch.equal(after[n][1], p) for n, (_, p) in before.items())
    return sigma_moved, psi_moved


def test_client_step_moves_psi_only_and_server_step_sigma_only() -> None:
    method = _method(optim=Optimization(client_lr=0.1, server_lr=0.1, weight_decay=0.0))
    images = torch.randn(8, 1, 28, 28)
    client = method.client_side().objective(method.broadcast(), _client(), None)
    assert isinstance(client, FedMatchClient)
    assert _one_step(client, (images, images)) == (False, True)  # sigma* frozen at a client
    server = method.server_objective()
    assert isinstance(server, FedMatchServer)
    assert _one_step(server, (images, torch.arange(8))) == (True, False)  # psi* at the server
    method.server_step_done(server, None)  # type: ignore[arg-type]
    trained = decomposed_parameters(server.network)
    for name, param in method.network.named_parameters():
        assert torch.equal(param, trained[name][0])  # the trained sigma is the global one


# --- what travels --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "want"), [(0, 0), (10, 80), (499, 8 * 499), (500, 4000), (900, 4000)]
)
def test_a_psi_with_k_nonzeros_costs_8k_bytes_or_the_dense_4p(k: int, want: int) -> None:
    psi = torch.zeros(1000)
    psi[torch.randperm(1000, generator=torch.Generator().manual_seed(k))[:k]] = 0.5
    part = encode_sparse(psi, psi != 0)
    assert payload_bytes({PSI: part}) == {PSI: want}  # float32 value + int32 index each
    assert torch.equal(decode_sparse(part, torch.zeros(1000)), psi)


def test_upload_sends_the_entries_changed_by_more_than_delta() -> None:
    method = _method(delta_threshold=1e-3, l1_threshold=1e-4)
    payload = method.broadcast()
    side = method.client_side()
    objective = side.objective(payload, _client(), None)
    assert isinstance(objective, FedMatchClient)
    received = objective.received
    assert torch.equal(received, method.psi)  # what was broadcast is what is received
    moved = torch.tensor([3, 70, 500])
    with torch.no_grad():
        flat = received.clone()
        flat[moved] += 0.01  # changed: sent
        flat[[4, 5]] += 1e-4  # within delta: not sent
        parts = method.layout.unflatten(flat)
        for name, (_, psi) in decomposed_parameters(objective.network).items():
            psi.copy_(parts[name])
    upload = side.upload(objective)
    part = state_part(upload, UPDATE)
    assert part["indices"].tolist() == moved.tolist()
    assert payload_bytes(upload) == {UPDATE: 8 * len(moved)}
    rebuilt = decode_sparse(part, method.psi)
    want = sparsify(received.clone(), 1e-4)
    want[moved] = sparsify(flat, 1e-4)[moved]
    torch.testing.assert_close(rebuilt, want)


def test_broadcast_sends_sigma_dense_and_psi_sparse() -> None:
    method = _method(psi_factor=0.0)  # psi = 0: nothing to send but sigma
    payload = method.broadcast()
    sizes = payload_bytes(payload)
    assert sizes[PSI] == 0
    assert sizes[SIGMA] == sum(
        t.numel() * t.element_size() for t in method.network.state_dict().values()
    )


# --- helpers ------------------------------------------------------------------------------


def test_nearest_helpers_on_known_embeddings() -> None:
    emb = {
        0: torch.tensor([1.0, 0.0]),
        1: torch.tensor([0.9, 0.1]),
        2: torch.tensor([0.0, 1.0]),
        3: torch.tensor([0.6, 0.4]),
        5: torch.tensor([0.6, 0.4]),
    }
    assert nearest_helpers(emb, 0, 2) == [1, 3]  # 3 and 5 tie: the lower id
    assert nearest_helpers(emb, 2, 2) == [3, 5]
    assert nearest_helpers(emb, 3, 1) == [5]  # distance 0
    assert nearest_helpers({0: emb[0]}, 0, 2) == []  # no one else known
    assert nearest_helpers(emb, 0, 9) == [1, 3, 5, 2]  # fewer than asked


def test_each_client_receives_the_models_nearest_to_its_own() -> None:
    """Four uploaded models whose predictions on the probe are known (a large head bias makes
    them one class, or two): each client's helpers are the two nearest, sent as their psi."""
    method = _method(helper_interval=2)
    offset = 0
    for name, _, numel in method.layout.entries:
        if name == "head.0.bias":
            break
        offset += numel
    biases = {0: {3: 30.0}, 1: {3: 29.0}, 2: {3: 30.0, 5: 30.0}, 3: {7: 30.0}}
    psis, updates = {}, []
    for cid, bias in biases.items():
        psi = method.psi.clone()
        for cls, value in bias.items():
            psi[offset + cls] += value
        psis[cid] = psi
        changed = psi != method.psi
        upload = {UPDATE: encode_sparse(psi, changed)}
        updates.append(ClientUpdate(cid, upload, 10))  # type: ignore[arg-type]
    method.aggregate(updates)
    one_hot = torch.zeros(10, dtype=torch.float64)
    one_hot[3] = 1.0
    torch.testing.assert_close(method.embeddings[0], one_hot)  # softmax on the probe
    payload = method.broadcast()
    method.on_round_start(4, 10)  # a helper round (4 % 2 == 0)
    sent = method.client_payload(payload, 0)
    assert [p for p in sent if p.startswith("helper")] == ["helper0", "helper1"]
    for j, helper in enumerate([1, 2]):  # 1 predicts class 3 too, 2 half of it
        got = decode_sparse(state_part(sent, helper_part(j)), torch.zeros_like(method.psi))
        torch.testing.assert_close(got, sparsify(psis[helper], method.l1_threshold))
    sent = method.client_payload(payload, 3)  # class 7: nearest is the half-class-3 model
    got = decode_sparse(state_part(sent, helper_part(0)), torch.zeros_like(method.psi))
    torch.testing.assert_close(got, sparsify(psis[2], method.l1_threshold))
    assert method.client_payload(payload, 9) is payload  # never uploaded: no embedding
    method.on_round_start(5, 10)  # not a helper round
    assert method.client_payload(payload, 0) is payload
    # the client builds each helper as the sigma it received + the helper's psi
    method.on_round_start(4, 10)
    side = method.client_side()
    objective = side.objective(method.client_payload(payload, 0), _client(), None)
    assert isinstance(objective, FedMatchClient) and len(objective.helpers) == 2
    want = method.theta(sparsify(psis[1], method.l1_threshold)).eval()
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(objective.helpers[0].eval()(x), want(x))


def test_fedmatch_is_marked_not_private() -> None:
    assert FedMatch.private is False
    assert marks(FedMatch) == ("not private",)


# --- real data ----------------------------------------------------------------------------


def _fed(root: Path, run_dir: Path, rounds: int, **config: object) -> Federation:
    data = tiny_data(
        root,
        num_clients=3,
        examples_per_client=64,
        client_batch_size=32,
        labeled_per_class=50,
        test_subset=500,
    )
    method = FedMatch(
        Architecture(10, 1),
        optim=Optimization(client_lr=0.03, server_lr=0.03),
        loss=FedMatchLoss(lambda_i=1.0, lambda_a=1.0, lambda_l2=0.03),
        helper_interval=1,
        lambda_s=1.0,
    )
    cfg = FederationConfig(rounds=rounds, clients_per_round=3, server_epochs=2, **config)  # type: ignore[arg-type]
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


@pytest.mark.slow  # about 9 s on a shared 2-core CPU: three rounds of three clients
def test_fedmatch_learns_on_fashion_mnist_and_counts_its_bytes(
    fmnist_root: Path, tmp_path: Path
) -> None:
    result = _fed(fmnist_root, tmp_path / "run", rounds=3).run()
    first, last = result.history[0], result.history[-1]
    assert last["test/acc"] > 0.4  # chance is 0.1
    assert "comm/bytes_down/helper0" not in first  # no model uploaded before round 1
    assert last["client/helpers"] == 2.0 and last["comm/bytes_down/helper1"] > 0
    assert last["client/mask_rate"] > 0
    dense = 3 * 4 * sum(p.numel() for p in build_classifier("small_cnn", 10, 1).parameters())
    assert 0 < last["comm/bytes_up"] == last["comm/bytes_up/psi_update"] <= dense
    assert 0 < last["comm/bytes_down/psi"] <= dense


@pytest.mark.slow  # about 11 s: four rounds in all
def test_resume_is_exact(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _fed(fmnist_root, tmp_path / "full", rounds=2)
    full.run()
    run_dir = tmp_path / "cut"
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _fed(fmnist_root, run_dir, rounds=2).run()
    undo()
    resumed = _fed(fmnist_root, run_dir, rounds=2, resume=str(run_dir / "checkpoints/last.ckpt"))
    resumed.run()
    want, got = full.method.state_dict(), resumed.method.state_dict()
    extra = want.pop("_extra_state"), got.pop("_extra_state")
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert extra[0]["embeddings"].keys() == extra[1]["embeddings"].keys() == {0, 1, 2}
    for cid in extra[0]["embeddings"]:
        assert torch.equal(extra[0]["embeddings"][cid], extra[1]["embeddings"][cid])
        for part in extra[0]["client_psi"][cid]:
            assert torch.equal(extra[0]["client_psi"][cid][part], extra[1]["client_psi"][cid][part])
