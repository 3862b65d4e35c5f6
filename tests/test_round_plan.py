"""A round as a declared plan: each method's steps, the plan's rules, the loop walking a plan in
order, and FedSwitch's KL report as a part of the upload."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import fedlit.methods
from fedlit.aggregation import Aggregated
from fedlit.data import ClientData, FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.federation.callbacks import Callback, RunView
from fedlit.methods import (
    CentralizedConsistency,
    CentralizedFixMatch,
    CentralizedUDA,
    ClientUpdate,
    FedAvgBYOL,
    FedAvgConsistency,
    FedAvgFixMatch,
    FedAvgSimCLR,
    FedAvgSimSiam,
    FedAvgSL,
    FedAvgSSL,
    FedAvgUDA,
    FedCon,
    FederatedMethod,
    FedMatch,
    FedRGD,
    FedSEAL,
    FedSup,
    FedSwitch,
    FL2,
    SemiFL,
    ServerSL,
    TeacherStudentEMA,
    TSClientEMA,
    TSServerEMA,
)
from fedlit.methods.base import Payload
from fedlit.methods.client_side import ClientSide, ObjectiveClientSide
from fedlit.methods.plan import RoundPlan, Step
from fedlit.methods.teacher_student import KL_REPORT
from fedlit.models import Architecture
from fedlit.objectives import FixMatch, Objective, Optimization, TeacherStudentClient

S, B, C, R, A, F, Z = (
    Step.SERVER,
    Step.BROADCAST,
    Step.CLIENTS,
    Step.RECEIVE,
    Step.AGGREGATE,
    Step.FINETUNE,
    Step.CENTRAL,
)

#: Each method's round as its paper runs it, written out by hand.
PLANS: dict[type[FederatedMethod], tuple[Step, ...]] = {
    ServerSL: (S,),
    FedAvgSL: (B, C, A, S),  # aggregate, then the server trains it (paper 002 5.1)
    FedAvgFixMatch: (S, B, C, A, F),  # paper 000's Algorithm 1: fine-tune the aggregate
    FedAvgUDA: (S, B, C, A, F),
    FedAvgSimCLR: (S, B, C, A, F),
    FedAvgSimSiam: (S, B, C, A, F),
    FedAvgBYOL: (S, B, C, A, F),
    FedSup: (S, B, C, A, F),
    FedCon: (S, B, C, A),
    FedMatch: (S, B, C, A),
    FedRGD: (B, S, C, A),  # server and clients train in parallel from w_avg (paper 004 3.2)
    FedSEAL: (B, C, R, A, S),  # every client receives the model (paper 002 Algorithm 1)
    TSServerEMA: (B, C, A, S),
    TSClientEMA: (B, C, A, S),
    FedSwitch: (B, C, A, S),
    CentralizedFixMatch: (S, Z, F),  # FedAvg-FixMatch's round, the clients' work at the server
    CentralizedUDA: (S, Z, F),
    SemiFL: (B, C, A, S),  # alternate training: fine-tune after aggregation (SemiFL Fig. 4b)
    FL2: (S, B, C, A, F),  # FedAvg-FixMatch's round (docs/methods/fl2.md's departures)
}


def _method(cls: type[FederatedMethod], **kw: Any) -> FederatedMethod:
    return cls(Architecture(10, 1), **kw)


def test_every_method_has_a_written_out_plan() -> None:
    abstract = {  # bases
        FederatedMethod, FedAvgConsistency, FedAvgSSL, TeacherStudentEMA, CentralizedConsistency
    }  # fmt: skip
    exported = {
        cls
        for cls in vars(fedlit.methods).values()
        if inspect.isclass(cls) and issubclass(cls, FederatedMethod) and cls not in abstract
    }
    assert exported == set(PLANS)


@pytest.mark.parametrize("cls", list(PLANS), ids=lambda cls: cls.__name__)
def test_each_method_declares_its_round(cls: type[FederatedMethod]) -> None:
    plan = _method(cls).round_plan()
    assert plan.steps == PLANS[cls]
    assert plan.uses_clients is (cls not in (ServerSL, CentralizedFixMatch, CentralizedUDA))
    assert (Step.RECEIVE in plan.steps) is (cls is FedSEAL)
    assert (plan.bootstrap_epochs > 0) is (cls is FedSEAL)  # FedSEAL's default: 10 epochs


def test_fedseal_bootstrap_length_is_its_setting() -> None:
    assert _method(FedSEAL).round_plan().bootstrap_epochs == 10
    assert _method(FedSEAL, bootstrap_epochs=3).round_plan().bootstrap_epochs == 3
    without = _method(FedSEAL, bootstrap_epochs=0).round_plan()
    assert without.bootstrap_epochs == 0 and without.steps == PLANS[FedSEAL]


@pytest.mark.parametrize(
    ("steps", "bootstrap", "message"),
    [
        ((), 0, "each step once"),
        ((S, S), 0, "each step once"),
        ((B, C), 0, "broadcast, clients, aggregate in this order"),
        ((C, B, A), 0, "broadcast, clients, aggregate in this order"),
        ((A, B, C), 0, "broadcast, clients, aggregate in this order"),
        ((S, R), 0, "receive comes between clients and aggregate"),
        ((B, C, A, R), 0, "receive comes between clients and aggregate"),
        ((R, B, C, A), 0, "receive comes between clients and aggregate"),
        ((F, S), 0, "finetune comes after aggregate"),
        ((S, F, B, C, A), 0, "finetune comes after aggregate"),
        ((S,), -1, "bootstrap_epochs must be >= 0"),
    ],
)
def test_a_plan_the_loop_cannot_run_is_refused(
    steps: tuple[Step, ...], bootstrap: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RoundPlan(steps, bootstrap)


# --- the loop walks the plan ----------------------------------------------------------------


class Recording(FedAvgFixMatch):
    """FedAvg-FixMatch under a plan set per test, recording its hooks in the order the loop
    calls them (the clients run in the driver's process, with this very object)."""

    steps: tuple[Step, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def round_plan(self) -> RoundPlan:
        return RoundPlan(self.steps)

    def on_round_start(self, round_idx: int, total_rounds: int) -> None:
        super().on_round_start(round_idx, total_rounds)
        self.calls.append(f"start {round_idx}")

    def server_objective(self) -> Objective | None:
        self.calls.append("server objective")
        return super().server_objective()

    def broadcast(self) -> Payload:
        self.calls.append("broadcast")
        return super().broadcast()

    def client_side(self) -> ClientSide:
        return RecordingClient(self)

    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        self.calls.append(f"aggregate {[u.client_id for u in updates]}")
        return super().aggregate(updates)

    def end_round(self) -> dict[str, float]:
        self.calls.append("end")
        return {}


class RecordingClient(ObjectiveClientSide):
    """:class:`Recording`'s client side, recording into its method's record (its clients run
    in the driver's process)."""

    def __init__(self, method: Recording) -> None:
        setup = method._client_setup()
        super().__init__(setup, ("weak", "strong"), FixMatch, loss=method.loss)
        self.calls = method.calls

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        self.calls.append(f"client {client.client_id}")
        return super().objective(payload, client, state)

    def receive(
        self,
        payload: Payload,
        clients: Sequence[ClientData],
        states: Sequence[Any],
        device: torch.device,
    ) -> list[Any]:
        self.calls.append(f"receive {[c.client_id for c in clients]}")
        return super().receive(payload, clients, states, device)


class Stages(Callback):
    """Writes each stage the loop announces into the method's record."""

    def on_stage(self, run: RunView, round_idx: int, stage: str) -> None:
        assert isinstance(run.method, Recording)
        run.method.calls.append(f"stage {stage}")

    def on_updates(
        self,
        run: RunView,
        round_idx: int,
        received: Sequence[Payload],
        updates: Sequence[ClientUpdate],
        metrics: dict[str, float],
    ) -> None:
        assert isinstance(run.method, Recording)
        run.method.calls.append(f"updates {[u.client_id for u in updates]}")


def _recording_round(root: Path, run_dir: Path, steps: tuple[Step, ...]) -> Federation:
    data = FederatedDataModule(
        root=str(root), num_clients=3, examples_per_client=32, client_batch_size=32, test_subset=100
    )
    method = Recording(Architecture(10, 1), optim=Optimization(client_lr=0.003))
    method.steps = steps
    config = FederationConfig(rounds=1, clients_per_round=2, server_epochs=1)
    fed = Federation(
        method, data, config, run_dir=run_dir, progress=False, extra_callbacks=[Stages()]
    )
    fed.prepare()
    method.calls.clear()
    fed.run_round(1)
    return fed


def test_the_loop_walks_the_plan_in_order(fmnist_root: Path, tmp_path: Path) -> None:
    # an order no method uses: the receive and a fine-tune, the broadcast before the server
    fed = _recording_round(fmnist_root, tmp_path / "run", (B, S, C, R, A, F))
    assert isinstance(fed.method, Recording)
    trained = [int(c.split()[1]) for c in fed.method.calls if c.startswith("client ")]
    assert len(trained) == 2
    (idle,) = {0, 1, 2} - set(trained)  # 3 clients, 2 a round
    assert fed.method.calls == [
        "start 1",
        "broadcast",
        "stage server step",
        "server objective",
        "stage client 1/2",  # the client side sets its own round's values
        f"client {trained[0]}",
        "stage client 2/2",
        f"client {trained[1]}",
        f"receive [{idle}]",
        f"updates {trained}",
        f"aggregate {trained}",
        "stage fine-tune",
        "server objective",
        "end",
        "stage evaluation",
    ]


def test_a_plan_without_clients_runs_the_server_alone(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _recording_round(fmnist_root, tmp_path / "run", (S,))
    assert isinstance(fed.method, Recording)
    assert fed.method.calls == [
        "start 1",
        "stage server step",
        "server objective",
        "end",
        "stage evaluation",
    ]
    assert fed.visits == {}  # no client was sampled


# --- FedSwitch's KL report travels in the upload ----------------------------------------------


def _switch_client(method: FedSwitch, kl: Sequence[dict[str, float]]) -> TeacherStudentClient:
    """A FedSwitch client objective that measured the batches ``kl`` (eq 2's terms)."""
    side = method.client_side()
    side.on_round_start(1, 10)
    network = side.model(method.broadcast())
    objective = TeacherStudentClient(
        network, teacher=None, num_classes=10, loss=method.loss, **side.optimizer_kwargs()
    )
    for batch in kl:
        objective.accumulate(1.0, **{f"kl/{k}": torch.tensor(v) for k, v in batch.items()})
    return objective


def test_fedswitch_uploads_its_kl_report() -> None:
    method = FedSwitch(Architecture(10, 1))
    objective = _switch_client(
        method, [{"teacher": 0.5, "student": 0.25}, {"teacher": 1.0, "student": 0.75}]
    )
    upload = method.client_side().upload(objective)
    assert set(upload) == {"model", KL_REPORT}
    report = upload[KL_REPORT]
    assert isinstance(report, dict)
    assert {k: float(v) for k, v in report.items()} == {"teacher": 0.75, "student": 0.5}
    assert all(v.dtype == torch.float64 and v.shape == () for v in report.values())
    no_teacher = _switch_client(method, [{"student": 0.125}])  # a round without the teacher
    report = method.client_side().upload(no_teacher)[KL_REPORT]
    assert isinstance(report, dict)
    assert {k: float(v) for k, v in report.items()} == {"student": 0.125}


def test_fedswitch_aggregates_the_reports_not_the_metrics() -> None:
    method = FedSwitch(Architecture(10, 1))
    model = method._shared_state()

    def update(cid: int, report: dict[str, float]) -> ClientUpdate:
        kl = {k: torch.tensor(v, dtype=torch.float64) for k, v in report.items()}
        logged = {"kl/teacher": 9.0, "kl/student": 9.0}  # what the loggers see; not read
        return ClientUpdate(cid, {"model": model, KL_REPORT: kl}, 10, metrics=logged)

    method.aggregate([update(0, {"teacher": 0.5, "student": 1.0}), update(1, {"student": 2.0})])
    assert method.kl.tolist() == [0.5, 1.5]  # D_KL^T from the client that had a teacher
    assert method.kl_measured.tolist() == [True, True]
    method.aggregate([update(0, {"student": 0.0}), update(1, {"student": 1.0})])
    assert method.kl.tolist() == [0.5, 0.5]  # no teacher this round: D_KL^T kept
