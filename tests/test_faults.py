"""Faults a federation survives and faults that stop it, injected through test methods on the
real Fashion-MNIST; a real ``fedlit fit`` killed at a random moment and resumed; FedRGD's
warning about groups of two."""

from __future__ import annotations

import csv
import math
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_fit

from fedlit.aggregation import Aggregated, weighted_average
from fedlit.aggregation.payloads import Payload, state_part
from fedlit.cli import main
from fedlit.data import ClientData, FederatedDataModule
from fedlit.federation import (
    ROUND_FAILED,
    Federation,
    FederationConfig,
    RoundFailed,
    load_checkpoint,
)
from fedlit.federation.resume import Checkpointer
from fedlit.methods import ClientUpdate, FedAvgFixMatch, FederatedMethod, FedRGD
from fedlit.methods.base import StateDict
from fedlit.methods.client_side import ClientSide, ObjectiveClientSide
from fedlit.methods.fedrgd import PeerUploadWarning
from fedlit.methods.plan import SERVER_FIRST, RoundPlan
from fedlit.models import Architecture
from fedlit.objectives import FixMatch, Objective, Optimization

REPO = Path(__file__).parents[1]
FIXMATCH = REPO / "recipes" / "fedavg_fixmatch.yaml"


class Faulty(FedAvgFixMatch):
    """FedAvg-FixMatch whose client ``fault_client`` fails in round ``fault_round`` as
    ``fault`` says ("raise": its upload raises; "nan" / "inf": a weight of its upload is NaN /
    inf), its client side (:class:`FaultyClient`) recording every upload it makes."""

    fault: str | None = None
    fault_client = 1
    fault_round = 1

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST  # no fine-tune: the global model is the aggregate the tests check

    def client_side(self) -> ClientSide:
        return FaultyClient(self)


class FaultyClient(ObjectiveClientSide):
    """FedAvg-FixMatch's client, failing as its :class:`Faulty` method says, recording every
    upload it makes by (round, client)."""

    def __init__(self, method: Faulty) -> None:
        setup = method._client_setup()
        super().__init__(setup, ("weak", "strong"), FixMatch, loss=method.loss)
        self.fault, self.fault_client, self.fault_round = (
            method.fault,
            method.fault_client,
            method.fault_round,
        )
        self.uploads: dict[tuple[int, int], StateDict] = {}
        self.at = (0, -1)  # (round, client) of the client at work

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        self.at = (self.round_idx, client.client_id)
        return super().objective(payload, client, state)

    def upload(self, objective: Objective) -> Payload:
        upload = super().upload(objective)
        if self.at == (self.fault_round, self.fault_client):
            if self.fault == "raise":
                raise ValueError("injected client failure")
            if self.fault in ("nan", "inf"):
                upload["model"]["head.0.weight"][0, 0] = float(self.fault)  # type: ignore[index]
        self.uploads[self.at] = {k: v.clone() for k, v in state_part(upload, "model").items()}
        return upload


class NonFiniteGlobal(FedAvgFixMatch):
    """FedAvg-FixMatch whose global model turns NaN in round ``bad_round``, after ``stage``:
    "aggregation" (its aggregate) or "server" (its server step)."""

    stage = "aggregation"
    bad_round = 2

    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        result = super().aggregate(updates)
        if self.stage == "aggregation" and self.round_idx == self.bad_round:
            self._poison()
        return result

    def server_step_done(
        self, objective: Objective, data: FederatedDataModule, device: torch.device | None = None
    ) -> None:
        if self.stage == "server" and self.round_idx == self.bad_round:
            self._poison()

    def _poison(self) -> None:
        with torch.no_grad():
            self.network.head[0].bias.fill_(float("nan"))


def _fed(
    root: Path,
    run_dir: Path,
    method: FederatedMethod,
    num_clients: int = 3,
    **config: Any,
) -> Federation:
    data = FederatedDataModule(
        root=str(root),
        num_clients=num_clients,
        examples_per_client=64,
        client_batch_size=32,
        labeled_per_class=5,
        test_subset=200,
    )
    cfg = FederationConfig(
        **{"rounds": 1, "clients_per_round": num_clients, "final_eval": (), **config}
    )
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


def _method(cls: type[FederatedMethod], **attrs: Any) -> Any:
    method = cls(Architecture(10, 1), optim=Optimization(client_lr=0.003))
    for key, value in attrs.items():
        setattr(method, key, value)
    return method


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _checkpoints_written(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bytes of every checkpoint the runs write from now on, in order."""
    written: list[bytes] = []
    original = Checkpointer.save

    def recorded(self: Checkpointer, round_idx: int, *state: Any) -> None:
        original(self, round_idx, *state)
        written.append(self.path.read_bytes())

    monkeypatch.setattr(Checkpointer, "save", recorded)
    return written


# --- a faulty client is left out, the round goes on -------------------------------------------
@pytest.mark.parametrize(("fault", "code"), [("raise", 1.0), ("nan", 2.0), ("inf", 2.0)])
def test_faulty_client_is_left_out_of_the_round(
    fault: str,
    code: float,
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    method = _method(Faulty, fault=fault)
    fed = _fed(fmnist_root, tmp_path / "run", method)
    final = fed.run().final
    err = capsys.readouterr().err
    assert "round 1: client 1 " in err and "left out" in err, err
    assert ("ValueError: injected client failure" in err) == (fault == "raise"), err
    assert ("head.0.weight" in err) == (fault != "raise"), err

    # the global model is the FedAvg of the two others' uploads (equal shards: equal weights)
    uploads = fed.runner.client.uploads  # type: ignore[attr-defined]
    survivors = [uploads[(1, 0)], uploads[(1, 2)]]
    expected = weighted_average(survivors, [64, 64])
    state = method.network.state_dict()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    assert fed.visits == {0: 1, 1: 1, 2: 1}  # the faulty visit counts

    assert final["fault/clients"] == 1 and final["fault/client_1"] == code
    assert math.isfinite(final["test/acc"]) and math.isfinite(final["diag/weight_diversity"])
    row = _rows(tmp_path / "run")[-1]
    assert float(row["fault/clients"]) == 1 and float(row["fault/client_1"]) == code
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert ckpt["round"] == 1


def test_clean_round_logs_no_fault(fmnist_root: Path, tmp_path: Path) -> None:
    final = _fed(fmnist_root, tmp_path / "run", _method(Faulty), num_clients=2).run().final
    assert final["fault/clients"] == 0
    assert not [k for k in final if k.startswith("fault/client_")]


# --- too few clients left: the run stops, the last checkpoint kept ----------------------------
def test_fewer_survivors_than_min_clients_stop_the_run(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _checkpoints_written(monkeypatch)
    run_dir = tmp_path / "run"
    method = _method(Faulty, fault="nan", fault_round=2)
    fed = _fed(fmnist_root, run_dir, method, num_clients=2, rounds=2, min_clients=2)
    with pytest.raises(RoundFailed) as exc:
        fed.run()
    message = str(exc.value)
    for part in ("round 2", "1 of 2 clients", "federation.min_clients=2", "client 1", "round 1"):
        assert part in message, message
    assert len(written) == 1  # round 1's
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == written[0]
    assert [r["round"] for r in _rows(run_dir)] == ["0", "1.0"]


def test_min_clients_is_checked(fmnist_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"federation\.min_clients"):
        FederationConfig(min_clients=0)
    fed = _fed(fmnist_root, tmp_path / "run", _method(Faulty), num_clients=2, min_clients=3)
    with pytest.raises(ValueError, match=r"federation\.min_clients=3 exceeds"):
        fed.prepare()


# --- a global model that is no longer finite is never checkpointed -------------------------
@pytest.mark.parametrize(("stage", "named"), [("aggregation", "aggregation"), ("server", "server")])
def test_nonfinite_global_model_stops_the_run(
    stage: str, named: str, fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _checkpoints_written(monkeypatch)
    run_dir = tmp_path / "run"
    fed = _fed(fmnist_root, run_dir, _method(NonFiniteGlobal, stage=stage), rounds=2)
    with pytest.raises(
        RoundFailed, match=rf"round 2: the global model is not finite after.*{named}"
    ):
        fed.run()
    assert len(written) == 1
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == written[0]
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert ckpt["round"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["method_state"].values())
    assert [r["round"] for r in _rows(run_dir)] == ["0", "1.0"]


def _fit(root: Path, run_dir: Path, *extra: str) -> list[str]:
    """``fedlit fit`` arguments for a tiny FedAvg-FixMatch run (2 clients, 2 rounds)."""
    return tiny_fit(FIXMATCH, root, run_dir, *extra, rounds=2)


def test_cli_stops_a_failed_round_with_its_own_status(
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    original = FedAvgFixMatch.aggregate

    def nan_in_round_2(self: FedAvgFixMatch, updates: Sequence[ClientUpdate]) -> Aggregated:
        result = original(self, updates)
        if self.round_idx == 2:
            with torch.no_grad():
                self.network.head[0].weight.fill_(float("nan"))
        return result

    monkeypatch.setattr(FedAvgFixMatch, "aggregate", nan_in_round_2)
    run_dir = tmp_path / "run"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(_fit(fmnist_root, run_dir))
    err = capsys.readouterr().err
    assert exc.value.code == ROUND_FAILED != 0, err
    assert "Traceback" not in err
    assert "round 2: the global model is not finite after aggregation" in err, err
    assert "network.head.0.weight" in err and str(run_dir / "checkpoints" / "last.ckpt") in err
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 1


# --- a real fit killed at a random moment, then resumed --------------------------------------
def _checkpoint_round(path: Path) -> int:
    try:
        return int(load_checkpoint(path)["round"])
    except ValueError:  # not there yet
        return 0


def _kill_at_a_random_moment(
    args: list[str], run_dir: Path, round_s: float, rng: random.Random
) -> bool:
    """Start ``fedlit fit args`` (4 rounds; a fresh run or a resume) in a subprocess; once the
    checkpoint of round k is there (k drawn after the round it starts from, up to 3), wait a
    random fraction of a round (``round_s`` seconds), then SIGKILL it: anywhere in rounds 2 to
    4, training, evaluating, logging or checkpointing. Returns whether it was killed before it
    finished."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    k, fraction = rng.randint(_checkpoint_round(ckpt) + 1, 3), rng.uniform(0.0, 0.9)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedlit", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        seen, inode, started = 0, None, time.monotonic()
        while seen < k and proc.poll() is None and time.monotonic() - started < 120:
            stat = ckpt.stat() if ckpt.exists() else None
            if stat is not None and stat.st_ino != inode:  # replaced: a new round's checkpoint
                inode, seen = stat.st_ino, _checkpoint_round(ckpt)
            time.sleep(0.005)
        time.sleep(fraction * round_s)
        proc.send_signal(signal.SIGKILL)
    finally:
        code = proc.wait()
    return code == -signal.SIGKILL


@pytest.mark.slow  # about 20 s: three runs, two of them killed subprocesses
def test_fit_killed_at_random_moments_resumes_to_the_same_weights(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """A 4-round fit killed at a random moment, its resume killed again if it has rounds left
    to lose, and the last resume run to the end: the weights of the uninterrupted run, bit for
    bit, and each round logged once with the same test accuracy."""
    rounds = ["--federation.rounds=4"]
    reference = tmp_path / "reference"
    main(_fit(fmnist_root, reference, *rounds))
    reference_rows = _rows(reference)
    round_s = sum(float(r["time/round_s"]) for r in reference_rows[1:]) / 4
    rng = random.Random(14)
    for attempt in range(3):  # a kill drawn too late (the run had finished) is drawn again
        run_dir = tmp_path / f"killed{attempt}"
        if _kill_at_a_random_moment(_fit(fmnist_root, run_dir, *rounds), run_dir, round_s, rng):
            break
    else:
        pytest.fail("the run finished before every kill")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    resume = f"--federation.resume={ckpt}"
    if _checkpoint_round(ckpt) < 3:  # the resume, killed in turn
        _kill_at_a_random_moment(_fit(fmnist_root, run_dir, *rounds, resume), run_dir, round_s, rng)
    if _checkpoint_round(ckpt) < 4:
        main(_fit(fmnist_root, run_dir, *rounds, resume))

    want, got = load_checkpoint(reference / "checkpoints" / "last.ckpt"), load_checkpoint(ckpt)
    assert got["round"] == want["round"] == 4
    assert got["method_state"].keys() == want["method_state"].keys()
    for key, value in want["method_state"].items():
        assert torch.equal(got["method_state"][key], value), key
    rows = _rows(run_dir)
    assert [float(r["round"]) for r in rows] == [0, 1, 2, 3, 4]
    assert [r["test/acc"] for r in rows] == [r["test/acc"] for r in reference_rows]


# --- FedRGD: groups of two expose a peer's upload --------------------------------------------
def _rgd_updates(method: FedRGD, clients: int) -> list[ClientUpdate]:
    state = {k: v for k, v in method.network.state_dict().items() if method.is_shared(k)}
    return [
        ClientUpdate(cid, {"model": {k: v.clone() for k, v in state.items()}}, 10)
        for cid in range(clients)
    ]


@pytest.mark.parametrize(
    ("num_groups", "clients", "warned"),
    [(2, 4, True), (2, 5, True), (2, 6, False), (1, 2, False), (3, 3, False)],
)
def test_fedrgd_warns_when_a_group_of_two_exposes_a_peer(
    num_groups: int, clients: int, warned: bool
) -> None:
    method = FedRGD(Architecture(10, 1), num_groups=num_groups)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        method.aggregate(_rgd_updates(method, clients))
        method.aggregate(_rgd_updates(method, clients))  # once per run, not every round
    found = [w for w in caught if issubclass(w.category, PeerUploadWarning)]
    assert len(found) == int(warned), [str(w.message) for w in caught]
    if warned:
        assert "3 w_avg,i - w_s - w_a" in str(found[0].message)


def test_nonfinite_tensors_names_each_bad_tensor_in_order() -> None:
    """Nested dicts and lists: the floating (and complex) tensors holding a NaN or an infinity
    are named by dotted key in the state's order; integer tensors and other values are
    skipped; an empty state names none."""
    from fedlit.federation.faults import nonfinite_tensors

    nan, inf = float("nan"), float("inf")
    state = {
        "a": torch.ones(3),
        "b": [torch.zeros(2), torch.tensor([1.0, nan])],
        "c": {"d": torch.tensor(inf), "e": torch.tensor([1, 2])},
        "f": torch.tensor([1 + 1j, complex(nan, 0)]),
        "g": "text",
        "h": torch.empty(0),
    }
    assert nonfinite_tensors(state) == ["b.1", "c.d", "f"]
    assert nonfinite_tensors(state, "model") == ["model.b.1", "model.c.d", "model.f"]
    assert nonfinite_tensors({"a": torch.ones(2)}) == [] and nonfinite_tensors({}) == []
    # finite values whose squares would overflow are finite; mixed dtypes are checked together
    huge = {
        "a": torch.tensor([1e300, -1e300], dtype=torch.float64),
        "b": torch.tensor([3e38, 3e38]),
        "c": torch.tensor([6e4], dtype=torch.float16),
    }
    assert nonfinite_tensors(huge) == []
    assert nonfinite_tensors(huge | {"d": torch.tensor([1.0, nan], dtype=torch.float16)}) == ["d"]
