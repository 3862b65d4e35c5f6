"""FedRGD, FedSEAL and the teacher-student EMA family on the real Fashion-MNIST."""

from __future__ import annotations

import copy
import csv
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import tiny_data

from fedlit.aggregation import state_bytes
from fedlit.data import ClientData, FederatedDataModule, visit_number
from fedlit.data.datasets import SPECS, ImageSplit
from fedlit.evaluation import batchnorm
from fedlit.evaluation.batchnorm import recalibrated
from fedlit.federation import Federation, FederationConfig, load_checkpoint, load_client_states
from fedlit.methods import (
    ClientUpdate,
    FedAvgFixMatch,
    FederatedMethod,
    FedRGD,
    FedSEAL,
    FedSwitch,
    ServerSL,
    TSClientEMA,
    TSServerEMA,
)
from fedlit.methods.base import Payload
from fedlit.methods.fedseal import THRESHOLDS
from fedlit.models import Architecture
from fedlit.objectives import FedSEALLoss, Objective, Optimization
from fedlit.objectives.fedseal import predict_probabilities


def _fed(
    root: Path,
    run_dir: Path,
    cls: type[FederatedMethod],
    data_kw: dict | None = None,
    method_kw: dict | None = None,
    optim_kw: dict | None = None,
    **config: object,
) -> Federation:
    data_args = dict(
        examples_per_client=64,
        client_batch_size=32,
        labeled_per_class=50,
        val_per_class=5,
        test_subset=2000,
    )
    data = tiny_data(root, **data_args | (data_kw or {}))
    optim = Optimization(**{"client_lr": 0.003, **(optim_kw or {})})
    method = cls(Architecture(10, 1), optim=optim, **(method_kw or {}))
    cfg = FederationConfig(**{"rounds": 1, "clients_per_round": 2, **config})  # type: ignore[arg-type]
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("cls", [FedRGD, FedSEAL, FedSwitch, TSServerEMA, TSClientEMA])
def test_method_learns_on_fashion_mnist(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path
) -> None:
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        cls,
        data_kw={"num_clients": 3, "examples_per_client": 240},
        optim_kw={"server_lr": 0.03},
        clients_per_round=3,
        rounds=2,
        server_epochs=5,
    )
    final = fed.run().final
    assert final["test/acc"] > 0.4, final  # chance is 0.1
    assert final["diag/weight_diversity"] > 0


def test_fedseal_logs_its_sets_and_keeps_the_ensemble_on_the_client(
    fmnist_root: Path, tmp_path: Path
) -> None:
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedSEAL,
        optim_kw={"server_lr": 0.03},
        method_kw={"bootstrap_epochs": 5, "loss": FedSEALLoss(ramp=0.67)},
        rounds=3,
    )
    result = fed.run()
    rows = _rows(tmp_path / "run")
    assert float(rows[0]["bootstrap_test/acc"]) > 0.3  # w^0 is trained before round 1
    for row in rows[1:]:
        for key in ("pseudo/pos_frac", "pseudo/neg_frac", "pseudo/pos_acc", "pseudo/neg_acc"):
            assert 0.0 <= float(row[key]) <= 1.0, key
    # complementary labels are nearly always right; more pseudo-labels are right than chance
    assert float(rows[-1]["pseudo/neg_acc"]) > 0.9
    assert float(rows[-1]["pseudo/pos_acc"]) > 0.3
    ckpt = load_checkpoint(result.checkpoint)
    states = load_client_states(result.checkpoint)
    for cid in (0, 1):
        state = states[cid]
        assert state["count"] == 3 and state["mean"].shape == (64, 10)
        torch.testing.assert_close(state["mean"].sum(1), torch.ones(64))
    thresholds = ckpt["method_state"]["thresholds"]
    assert thresholds.shape == (10,) and (thresholds >= 0).all() and thresholds.max() > 0.3
    assert (thresholds <= 1).all()  # paper 002 4.1.2: tau_m in [0, 1]
    # lambda_t = exp(-5 (1 - (t / 3) / 0.67)^2) in rounds 1, 2, then 1 once t / 3 >= 0.67
    lambdas = [float(row["fedseal/lambda"]) for row in rows[1:]]
    expected = [math.exp(-5 * (1 - (1 / 3) / 0.67) ** 2), math.exp(-5 * (1 - (2 / 3) / 0.67) ** 2)]
    assert lambdas == pytest.approx([*expected, 1.0])
    # the model the clients receive is the scored one: its BatchNorm statistics are already
    # those of the server's clean images, so re-estimating them changes nothing
    network = fed.method.network
    again = recalibrated(network, fed.data.server_plain_dataloader())
    theirs = again.state_dict()
    for name, ours in network.state_dict().items():
        if "running_" in name:
            torch.testing.assert_close(ours, theirs[name])
    # what travels: the model and 10 thresholds down, the model alone up
    model = state_bytes(fed.method.network.state_dict())
    assert float(rows[-1]["comm/bytes_down"]) == 2 * (model + 10 * 4)
    assert float(rows[-1]["comm/bytes_up"]) == 2 * model


def test_fedseal_clients_not_sampled_still_receive_every_model(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """Paper 002 Algorithm 1, line 6: all clients download w^t each round; the ones not
    sampled add its predictions to their self-ensemble (eq 8) without training."""
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedSEAL,
        data_kw={"num_clients": 3},
        optim_kw={"server_lr": 0.03},
        method_kw={"bootstrap_epochs": 1},
        clients_per_round=1,
        rounds=2,
    )
    fed.prepare()
    payloads, sampled = [], []
    original = fed.runner

    class Spy:
        def __call__(self, payload, cid, *args):  # type: ignore[no-untyped-def]
            payloads.append(copy.deepcopy(payload))
            sampled.append(cid)
            return original(payload, cid, *args)

        def receive(self, *args):  # type: ignore[no-untyped-def]
            return original.receive(*args)

    fed.runner = Spy()  # type: ignore[assignment]
    result = fed.run()
    states = load_client_states(result.checkpoint)
    assert len(payloads) == 2
    for cid in range(3):  # every client's ensemble holds both rounds' models
        assert states[cid]["count"] == 2
    idle = next(c for c in range(3) if c not in sampled)
    client = fed.data.client_data(idle)
    expected = torch.stack(
        [
            predict_probabilities(
                fed.method.client_side().model(p),
                client.plain_dataloader(),
            )[0]
            for p in payloads
        ]
    ).mean(0)
    torch.testing.assert_close(states[idle]["mean"], expected)
    model = state_bytes(fed.method.network.state_dict())
    assert float(_rows(tmp_path / "run")[-1]["comm/bytes_down"]) == 3 * (model + 10 * 4)


def test_fedseal_logs_the_thresholds_it_sends(fmnist_root: Path, tmp_path: Path) -> None:
    """Each row's fedseal/tau_<m> are the thresholds of that round's broadcast: round 1's
    measured on w^0 after the bootstrap (eq 5), round 2's on round 1's server model."""
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedSEAL,
        optim_kw={"server_lr": 0.03},
        method_kw={"bootstrap_epochs": 2},
        rounds=2,
    )
    sent = []
    fed.prepare()  # its checks build a client's objective on a copy of the method: spied after
    broadcast = fed.method.broadcast

    def spy():  # type: ignore[no-untyped-def]
        payload = broadcast()
        sent.append(payload[THRESHOLDS].clone())
        return payload

    fed.method.broadcast = spy  # type: ignore[method-assign]
    fed.run()
    rows = _rows(tmp_path / "run")[1:]
    assert len(sent) == len(rows) == 2
    for row, tau in zip(rows, sent, strict=True):
        logged = torch.tensor([float(row[f"fedseal/tau_{m}"]) for m in range(10)])
        torch.testing.assert_close(logged, tau)
    assert not torch.equal(sent[0], sent[1])  # measured again after round 1's server step


def test_fedseal_scores_its_network_after_one_batchnorm_pass_a_round(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's measure re-estimates w^t's BatchNorm statistics on its clean images, and
    the evaluation that follows scores w^t as it is: one pass a round (the bootstrap's too)
    where every scoring re-estimating gave two, with every metric and weight bit for bit the
    same (server images over several eval batches, a short last one)."""
    passes: list[int] = []  # the round of each pass
    update_bn = torch.optim.swa_utils.update_bn

    def runs(force: bool) -> tuple[list[dict[str, str]], dict[str, torch.Tensor], Counter[int]]:
        passes.clear()
        with monkeypatch.context() as patch:
            if force:  # every scoring re-estimates the statistics, as before FedSEAL kept them
                patch.setattr(batchnorm.Estimate, "holds", lambda *args: False)
            fed = _fed(
                fmnist_root,
                tmp_path / f"run{force}",
                FedSEAL,
                data_kw={"eval_batch_size": 128},  # 500 server images: 4 batches
                optim_kw={"server_lr": 0.03},
                method_kw={"bootstrap_epochs": 1},
                rounds=2,
            )

            def counted(*args: object, **kwargs: object) -> None:
                passes.append(fed.method.round_idx)
                update_bn(*args, **kwargs)  # type: ignore[arg-type]

            patch.setattr(torch.optim.swa_utils, "update_bn", counted)
            fed.run()
        rows = [
            {k: v for k, v in row.items() if not k.startswith("time/")}
            for row in _rows(tmp_path / f"run{force}")
        ]
        return rows, fed.method.state_dict(), Counter(passes)

    rows, state, counts = runs(force=False)
    forced_rows, forced_state, forced_counts = runs(force=True)
    assert forced_counts == {0: 2, 1: 2, 2: 2}  # measure and evaluation, each re-estimating
    assert counts == {0: 1, 1: 1, 2: 1}  # measure alone
    assert "test/acc" in rows[-1] and "bootstrap_test/acc" in rows[0]
    assert rows == forced_rows
    assert state.keys() == forced_state.keys()
    for key, value in state.items():
        assert torch.equal(value, forced_state[key]), key


def test_fedseal_ablations_fixed_tau_and_no_negative_learning(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """loss.fixed_tau sends that threshold for every class in every round; without negative
    learning the complementary set stays empty while the positive set is still built."""
    loss = FedSEALLoss(fixed_tau=0.6, negative_learning=False)
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedSEAL,
        optim_kw={"server_lr": 0.03},
        method_kw={"bootstrap_epochs": 2, "loss": loss},
        rounds=2,
    )
    fed.run()
    for row in _rows(tmp_path / "run")[1:]:
        assert [float(row[f"fedseal/tau_{m}"]) for m in range(10)] == pytest.approx([0.6] * 10)
        assert float(row["pseudo/neg_frac"]) == 0.0
        assert float(row["pseudo/pos_frac"]) > 0.0
        assert float(row["client/loss_neg"]) == 0.0
    assert torch.equal(fed.method.thresholds, torch.full((10,), 0.6))


def test_fedseal_thresholds_travel_with_the_model() -> None:
    method = FedSEAL(Architecture(10, 1))
    method.thresholds = torch.linspace(0.1, 1.0, 10)
    method.on_round_start(1, 10)
    payload = method.broadcast()
    torch.testing.assert_close(payload[THRESHOLDS], method.thresholds)
    split = ImageSplit(torch.zeros(4, 1, 28, 28, dtype=torch.uint8), torch.zeros(4).long())
    client = ClientData(0, 1, split, None, SPECS["fashion_mnist"], 4, 4, 4)
    objective = method.client_side().objective(payload, client, None)
    torch.testing.assert_close(objective.thresholds, method.thresholds)


def test_fedseal_needs_a_validation_set(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", FedSEAL, data_kw={"val_per_class": 0})
    with pytest.raises(ValueError, match="data.val_per_class"):
        fed.prepare()
    assert not (tmp_path / "run").exists()


def test_bytes_per_teacher_student_variant(fmnist_root: Path, tmp_path: Path) -> None:
    per_round = {}
    sent = []
    for cls in (TSServerEMA, TSClientEMA, FedSwitch, FedAvgFixMatch):
        fed = _fed(fmnist_root, tmp_path / cls.__name__, cls, rounds=3)
        fed.run()
        rows = _rows(tmp_path / cls.__name__)
        per_round[cls] = [
            (float(r["comm/bytes_down"]), float(r["comm/bytes_up"])) for r in rows[1:]
        ]
        if cls is FedSwitch:
            sent = [float(r["switch/use_teacher"]) for r in rows[1:]]
    model = 2 * state_bytes(fed.method.network.state_dict())  # two clients
    assert per_round[FedAvgFixMatch] == [(model, model)] * 3
    assert per_round[TSServerEMA] == [(2 * model, model)] * 3
    assert per_round[TSClientEMA] == [(2 * model, 2 * model)] * 3
    # FedSwitch: the teacher costs bytes down only in the rounds it is sent; never uploaded;
    # each client reports D_KL^S, and D_KL^T where it had the teacher (float64: 8 bytes each)
    assert sent[0] == 1.0
    kl = [2 * 8 * (1 + s) for s in sent]  # two clients
    assert per_round[FedSwitch] == [
        ((1 + s) * model, model + k) for s, k in zip(sent, kl, strict=True)
    ]
    rows = _rows(tmp_path / FedSwitch.__name__)[1:]
    assert [float(r["comm/bytes_up/kl"]) for r in rows] == kl


@pytest.mark.parametrize("beta", [0.0, 10.0])
def test_fedswitch_switches_on_the_logged_divergences(
    beta: float, fmnist_root: Path, tmp_path: Path
) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", FedSwitch, method_kw={"beta": beta}, rounds=3)
    fed.run()
    rows = _rows(tmp_path / "run")[1:]
    assert float(rows[0]["switch/use_teacher"]) == 1.0
    kl_teacher = float(rows[0]["kl/teacher"])
    for before, row in zip(rows, rows[1:], strict=False):
        if before["kl/teacher"] != "":
            kl_teacher = float(before["kl/teacher"])  # otherwise the last measured value
        kl_student = float(before["kl/student"])
        expected = abs(kl_teacher - beta) < abs(kl_student - beta)  # eq 3
        assert float(row["switch/use_teacher"]) == float(expected)
        assert (row["kl/teacher"] != "") is expected  # measured only with a teacher
        assert 0.0 <= float(row["kl/student"]) <= 2.3026


def test_teacher_is_the_ema_of_the_students(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _fed(fmnist_root, tmp_path / "run", TSServerEMA, method_kw={"ema_decay": 0.5}, rounds=2)
    fed.prepare()
    fed.run_round(1)  # ramp-up: after round 1 the teacher is the student
    student_1 = {k: v.clone() for k, v in fed.method.network.state_dict().items()}
    for k, v in fed.method.teacher.state_dict().items():
        torch.testing.assert_close(v, student_1[k])
    fed.run_round(2)  # then T = 0.5 T + 0.5 S
    student_2 = fed.method.network.state_dict()
    w = "backbone.stages.0.0.weight"
    expected = 0.5 * student_1[w] + 0.5 * student_2[w]
    torch.testing.assert_close(fed.method.teacher.state_dict()[w], expected)


def test_fedrgd_groups_start_from_their_own_average() -> None:
    method = FedRGD(Architecture(10, 1), num_groups=2)
    shape = {k: v for k, v in method.network.state_dict().items()}

    def const(c: float) -> dict[str, torch.Tensor]:
        return {k: torch.full_like(v, c) if v.is_floating_point() else v for k, v in shape.items()}

    method.network.load_state_dict(const(1.0))  # the server's model w_s
    updates = [
        ClientUpdate(cid, {"model": const(c)}, 10) for cid, c in ((3, 2.0), (5, 4.0), (8, 10.0))
    ]
    method.on_round_start(1, 10)
    method.aggregate(updates)
    w = "head.0.weight"
    # groups [3, 5], [8]: (1 + 2 + 4) / 3 = 7/3 and (1 + 10) / 2 = 5.5; w_avg is their mean
    assert float(method.network.state_dict()[w][0, 0]) == pytest.approx((7 / 3 + 5.5) / 2)
    payload = method.broadcast()
    assert float(method.client_payload(payload, 3)["model"][w][0, 0]) == pytest.approx(7 / 3)
    assert float(method.client_payload(payload, 5)["model"][w][0, 0]) == pytest.approx(7 / 3)
    assert float(method.client_payload(payload, 8)["model"][w][0, 0]) == pytest.approx(5.5)
    assert method.client_payload(payload, 0) is payload  # not in last round's groups
    single = FedRGD(Architecture(10, 1), num_groups=1)
    single.network.load_state_dict(const(1.0))
    single.aggregate(updates)  # eqs 4-5: (1 + 2 + 4 + 10) / 4
    assert float(single.network.state_dict()[w][0, 0]) == pytest.approx(4.25)


def test_fedrgd_clients_start_from_the_model_the_server_started_from(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """Paper 004: server and clients train in parallel from w_avg; the server's trained w_s
    only enters through the aggregation (the plan broadcasts before the server's step)."""
    received: list[Payload] = []
    trained: list[dict[str, torch.Tensor]] = []

    class Recording(FedRGD):
        def client_payload(self, payload: Payload, client_id: int) -> Payload:
            sent = super().client_payload(payload, client_id)
            received.append(sent)  # what the client receives
            return sent

        def server_step_done(
            self,
            objective: Objective,
            data: FederatedDataModule,
            device: torch.device | None = None,
        ) -> None:
            trained.append({k: v.clone() for k, v in self.network.state_dict().items()})

    fed = _fed(fmnist_root, tmp_path / "run", Recording, method_kw={"num_groups": 1})
    fed.prepare()
    before = {k: v.clone() for k, v in fed.method.network.state_dict().items()}
    fed.run_round(1)
    (w_s,) = trained
    w = "head.0.weight"
    assert not torch.equal(w_s[w], before[w])  # the server's step moved the network
    assert len(received) == 2
    for payload in received:
        torch.testing.assert_close(payload["model"], before)


def test_fedrgd_period_in_local_steps_and_self_training(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedRGD,
        optim_kw={"warmup": 0.1},
        method_kw={"self_training": True},
        local_steps=3,
    )
    fed.prepare()
    side = fed.method.client_side()
    loader = side.loader(fed.data.client_data(0))
    assert len(next(iter(loader))) == 1  # eq 3: one weak view
    fed.method.on_round_start(1, 1)
    side.on_round_start(1, 1)
    payload = fed.method.broadcast()
    objective = side.objective(payload, fed.data.client_data(0), None)
    fed.trainer.fit(objective, loader, 1, max_steps=3)
    assert objective.steps_taken() == 3  # T local steps, not an epoch (2 batches)
    # eq 9 ran: the rate the steps used is below the base rate
    assert objective.epoch_metrics()["lr"] < 0.003


def test_streaming_reveals_one_step_per_selection(fmnist_root: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []

    fed = _fed(
        fmnist_root,
        tmp_path / "run",
        FedAvgFixMatch,
        data_kw={"num_clients": 3, "examples_per_client": 60, "stream_steps": 3},
        clients_per_round=2,
        rounds=4,
    )
    fed.prepare()
    side = fed.runner.client
    loader = side.loader

    def recording(client: ClientData):  # type: ignore[no-untyped-def]
        seen.append((client.client_id, client.visit))
        return loader(client)

    side.loader = recording  # type: ignore[method-assign]
    fed.run()
    for cid in range(3):
        visits = [v for c, v in seen if c == cid]
        assert visits == list(range(1, len(visits) + 1))
        assert fed.visits.get(cid, 0) == visit_number(cid, 3, 2, 0, 4)
    rows = _rows(tmp_path / "run")
    assert float(rows[0]["data/stream_steps"]) == 3


def test_labels_at_client(fmnist_root: Path, tmp_path: Path) -> None:
    data_kw = {"labels_at": "client"}
    fed = _fed(fmnist_root, tmp_path / "run", FedSwitch, data_kw=data_kw, rounds=1)
    final = fed.run().final
    assert not any(k.startswith("server/") for k in final)  # no server training
    assert final["client/loss_s"] > 0  # clients train on their own labels
    for cls in (ServerSL, FedSEAL):
        fed = _fed(fmnist_root, tmp_path / cls.__name__, cls, data_kw=data_kw)
        with pytest.raises(ValueError, match="data.labels_at"):
            fed.prepare()
