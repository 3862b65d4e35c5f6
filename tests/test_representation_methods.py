"""FedAvg-SimCLR/SimSiam/BYOL, FedCon and FedSup on the real Fashion-MNIST."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import stop_in_round

from fedlit.aggregation import state_bytes
from fedlit.aggregation.payloads import payload_bytes, state_part
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig, load_checkpoint, load_client_states
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.methods import (
    FedAvgBYOL,
    FedAvgSimCLR,
    FedAvgSimSiam,
    FedCon,
    FederatedMethod,
    FedSup,
)
from fedlit.models import Architecture
from fedlit.objectives import Optimization, feature_map_weight


def _fed(
    root: Path,
    run_dir: Path,
    cls: type[FederatedMethod],
    num_clients: int = 2,
    per_client: int = 96,
    **config: object,
) -> Federation:
    data = FederatedDataModule(
        root=str(root),
        num_clients=num_clients,
        examples_per_client=per_client,
        client_batch_size=32,
        test_subset=2000,
    )
    method = cls(Architecture(10, 1), optim=Optimization(client_lr=0.003))
    cfg = FederationConfig(**{"rounds": 1, "clients_per_round": num_clients, **config})  # type: ignore[arg-type]
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


@pytest.mark.parametrize("cls", [FedAvgSimCLR, FedAvgSimSiam, FedAvgBYOL, FedCon, FedSup])
def test_method_learns_on_fashion_mnist(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path
) -> None:
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        cls,
        num_clients=4,
        per_client=240,
        clients_per_round=3,
        rounds=2,
        server_epochs=5,
        final_eval=("finetune", "linear"),
        eval_epochs=3,
    )
    final = fed.run().final
    assert final["test/acc"] > 0.4, final  # chance is 0.1
    # the encoder after two rounds, judged by 3 epochs of each protocol: well above chance
    assert final["eval/finetune_acc"] > 0.25, final
    assert final["eval/linear_acc"] > 0.2, final


def test_fedcon_projector_stays_with_each_client(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", FedCon)
    fed.prepare()
    payload = fed.method.broadcast()
    assert set(payload) == {"model"}
    assert payload["model"] and all(k.startswith("backbone.") for k in payload["model"])
    updates = [fed.runner(payload, cid, 1, None) for cid in (0, 1)]
    for u in updates:
        assert set(u.upload) == {"model"}
        assert all(k.startswith("backbone.") for k in u.model)  # the projector: never uploaded
        assert set(u.state) == {"projector"}
    p0, p1 = (u.state["projector"] for u in updates)
    assert any(not torch.equal(p0[k], p1[k]) for k in p0)
    # the next round starts from the kept projector, not from a fresh one
    again = fed.runner(payload, 0, 2, updates[0].state)
    fresh = fed.runner(payload, 0, 2, None)
    assert any(
        not torch.equal(again.state["projector"][k], fresh.state["projector"][k]) for k in p0
    )


def test_fedcon_identity_projector_starts_new_clients_at_the_identity(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """The ablation: a client's new projector is the identity map (a kept one is loaded as
    before), so with the target equal to the received backbone its first loss is only the two
    views' difference, far below a drawn projector's."""
    from fedlit.methods.fedcon import FedConClientSide

    fed = _fed(fmnist_root, tmp_path / "run", FedCon)
    fed.prepare()
    payload = fed.method.broadcast()
    side = fed.method.client_side()
    assert isinstance(side, FedConClientSide) and not side.identity_projector
    client = fed.data.client_data(0, 1)
    setup = fed.method._client_setup()  # type: ignore[attr-defined]
    identity = FedConClientSide(setup, side.ema_decay, identity_projector=True)
    drawn_net = side.objective(payload, client, None).network
    assert drawn_net.projector is not None
    drawn_weight = drawn_net.projector.state_dict()
    eye_net = identity.objective(payload, client, None).network
    assert eye_net.projector is not None
    bias, weight = (v for _, v in sorted(eye_net.projector.state_dict().items()))
    assert torch.equal(weight, torch.eye(len(weight))) and not bias.any()
    assert not torch.equal(next(iter(drawn_weight.values())), weight)
    kept = {"projector": {k: v + 1 for k, v in drawn_weight.items()}}
    loaded = identity.objective(payload, client, kept).network.projector
    assert loaded is not None
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, kept["projector"][key])
    # the first visit's loss, at the identity: the views' difference only
    losses = {}
    for name, s in (("drawn", side), ("identity", identity)):
        update = dataclasses.replace(fed.runner, client=s)(payload, 0, 1, None)
        losses[name] = update.metrics["loss"]
    assert losses["identity"] < losses["drawn"] / 2, losses


def test_fedcon_bytes_and_checkpointed_projectors(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", FedCon)
    result = fed.run()
    backbone = {
        k: v for k, v in fed.method.network.state_dict().items() if k.startswith("backbone.")
    }
    assert result.final["comm/bytes_up"] == 2 * state_bytes(backbone)
    assert result.final["comm/bytes_down"] == 2 * state_bytes(backbone)
    ckpt = load_checkpoint(result.checkpoint)
    states = load_client_states(result.checkpoint)
    assert set(states) == {0, 1}
    for cid in (0, 1):
        for k, v in fed.store.get(cid)["projector"].items():
            assert torch.equal(states[cid]["projector"][k], v)
    state = ckpt["method_state"]  # the target net and its step count are module state
    assert any(k.startswith("target.") for k in state) and int(state["server_steps"]) > 0


@pytest.mark.parametrize("kill", ["before the round", "between its states and its checkpoint"])
def test_fedcon_resume_equals_uninterrupted(
    kill: str, fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resume after a kill in round 2, before it starts or after its clients' states were
    written but before its checkpoint: the run continues as if never stopped."""
    full = _fed(fmnist_root, tmp_path / "full", FedCon, rounds=2)
    full.run()
    if kill == "before the round":
        undo = stop_in_round(monkeypatch, 2)
    else:  # the checkpoint's file, after the states it names were written
        original = RunCheckpoint.save

        def killed(self: RunCheckpoint, path: Path) -> None:
            if self.round == 2:
                raise KeyboardInterrupt
            original(self, path)

        monkeypatch.setattr(RunCheckpoint, "save", killed)
        undo = monkeypatch.undo
    with pytest.raises(KeyboardInterrupt):  # stopped in round 2 of the same 2-round run
        _fed(fmnist_root, tmp_path / "cut", FedCon, rounds=2).run()
    undo()
    clients = tmp_path / "cut" / "checkpoints" / "clients"
    written = sorted(p.name for p in clients.iterdir())
    resumed = _fed(
        fmnist_root,
        tmp_path / "cut",
        FedCon,
        rounds=2,
        resume=str(tmp_path / "cut" / "checkpoints" / "last.ckpt"),
    )
    resumed.run()
    if kill != "before the round":  # round 2's files were written, not yet checkpointed
        assert {"0.r2.pt", "1.r2.pt"} <= set(written)
    assert sorted(p.name for p in clients.iterdir()) == ["0.r2.pt", "1.r2.pt"]
    for k, v in full.method.network.state_dict().items():
        assert torch.equal(v, resumed.method.network.state_dict()[k]), k
    for cid in (0, 1):
        for k, v in full.store.get(cid)["projector"].items():
            assert torch.equal(v, resumed.store.get(cid)["projector"][k]), k


def test_fedsup_sends_both_networks_and_weights_the_feature_loss(
    fmnist_root: Path, tmp_path: Path
) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", FedSup, rounds=4)
    fed.prepare()
    method = fed.method
    payload = method.broadcast()
    assert set(payload) == {"model", "target"}  # the online network and f_Server
    sizes = payload_bytes(payload)
    assert sizes["model"] == sizes["target"] == state_bytes(state_part(payload, "model"))
    assert not any(k.startswith("head.") for k in state_part(payload, "model"))
    side = method.client_side()
    for t in (1, 2, 4):
        side.on_round_start(t, 4)
        objective = side.objective(payload, fed.data.client_data(0), None)
        assert objective.mse_weight == pytest.approx(1e-4 ** (t / 4))
        assert objective.mse_weight == feature_map_weight(1e-4, t, 4)
    assert method.eval_network() is method.server_network
    final = fed.run().final
    assert final["comm/bytes_down"] == 2 * final["comm/bytes_up"]
