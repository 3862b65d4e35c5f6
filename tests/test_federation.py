"""The federation driver on real Fashion-MNIST: learning, determinism, resume, communication."""

from __future__ import annotations

import csv
import json
import os
import signal
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import stop_in_round
from lightning import LightningModule
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from fedlit.aggregation import state_bytes
from fedlit.data import ClientData, FederatedDataModule, ImageSplit
from fedlit.federation import (
    Callback,
    Federation,
    FederationConfig,
    RunView,
    load_checkpoint,
)
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.federation.server import Server
from fedlit.federation.fit import TrainerTemplate, compiled
from fedlit.methods import (
    FedAvgFixMatch,
    FedAvgSL,
    FedCon,
    FederatedMethod,
    FedRGD,
    FedSEAL,
    FedSup,
    FedSwitch,
    ServerSL,
)
from fedlit.methods.base import marks
from fedlit.models import Architecture
from fedlit.objectives import FixMatchLoss, Objective


def _federation(
    root: Path,
    run_dir: Path,
    method_cls: type[FederatedMethod] = FedAvgFixMatch,
    seed: int = 0,
    data_kw: dict | None = None,
    method_kw: dict | None = None,
    **config: object,
) -> Federation:
    data_args = dict(root=str(root), num_clients=4, examples_per_client=128, client_batch_size=32)
    data_args.update(data_kw or {})
    data = FederatedDataModule(**data_args)  # type: ignore[arg-type]
    method = method_cls(Architecture(10, 1), **(method_kw or {}))
    cfg = FederationConfig(**{"rounds": 2, "clients_per_round": 2, **config})  # type: ignore[arg-type]
    return Federation(method, data, cfg, run_dir=run_dir, seed=seed, progress=False)


def _weights(fed: Federation) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in fed.method.network.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_federation_learns_above_server_sl_first_round(fmnist_root: Path, tmp_path: Path) -> None:
    data_kw = {"num_clients": 5, "examples_per_client": 600, "client_batch_size": 64}
    common = {"clients_per_round": 5, "server_epochs": 5}
    server = _federation(
        fmnist_root, tmp_path / "sl", ServerSL, data_kw=data_kw, rounds=1, **common
    )
    first = server.run().final["test/acc"]
    fed = _federation(fmnist_root, tmp_path / "fm", data_kw=data_kw, rounds=4, **common).run()
    accs = [h["test/acc"] for h in fed.history]
    assert min(accs) >= 0.0 and max(accs) <= 1.0
    assert accs[-1] > first, (accs, first)
    assert accs[-1] > 0.5  # chance is 0.1


def test_same_seed_same_weights_other_seed_differs(fmnist_root: Path, tmp_path: Path) -> None:
    torch.manual_seed(1)  # the global generators' state before a run must not matter
    a = _federation(fmnist_root, tmp_path / "a")
    a.run()
    torch.manual_seed(2)
    b = _federation(fmnist_root, tmp_path / "b")
    b.run()
    _assert_same(_weights(a), _weights(b))
    c = _federation(fmnist_root, tmp_path / "c", seed=1)
    c.run()
    assert not torch.equal(_weights(a)["head.0.weight"], _weights(c)["head.0.weight"])


def test_resume_equals_uninterrupted_run(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _federation(fmnist_root, tmp_path / "full", rounds=3)
    full_result = full.run()

    run_dir = tmp_path / "cut"
    cut = _federation(fmnist_root, run_dir, rounds=3)
    undo = stop_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        cut.run()
    undo()
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["round"] == 2

    resumed = _federation(
        fmnist_root, run_dir, rounds=3, resume=str(run_dir / "checkpoints/last.ckpt")
    )
    result = resumed.run()
    _assert_same(_weights(full), _weights(resumed))
    assert result.final["test/acc"] == full_result.final["test/acc"]
    assert [h["round"] for h in result.history] == [1.0, 2.0, 3.0]
    rounds_logged = [r["round"] for r in _csv_rows(run_dir / "metrics.csv")]
    assert rounds_logged == ["0", "1.0", "2.0", "3.0"]  # rows before the crash are kept


@pytest.mark.parametrize("method_cls", [FedRGD, FedSEAL, FedSwitch, FedCon, FedSup])
def test_resume_restores_the_whole_method_state(
    method_cls: type[FederatedMethod],
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a method keeps across rounds (group models, thresholds, KL values, targets, step
    counts, the server's own network) is module state: ``method.state_dict()`` is all the
    checkpoint needs, and a resumed run ends where the uninterrupted one does."""
    kw: dict = {"data_kw": {"val_per_class": 2, "test_subset": 100}, "server_epochs": 1}
    if method_cls is FedSEAL:
        kw["method_kw"] = {"bootstrap_epochs": 1}
    full = _federation(fmnist_root, tmp_path / "full", method_cls, rounds=3, **kw)
    full.run()
    run_dir = tmp_path / "cut"
    undo = stop_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        _federation(fmnist_root, run_dir, method_cls, rounds=3, **kw).run()
    undo()
    resume = str(run_dir / "checkpoints/last.ckpt")
    resumed = _federation(fmnist_root, run_dir, method_cls, rounds=3, resume=resume, **kw)
    resumed.run()
    want, got = full.method.state_dict(), resumed.method.state_dict()
    extra = {k for k in want if k.endswith("_extra_state")}
    _assert_same(
        {k: v for k, v in want.items() if k not in extra},
        {k: v for k, v in got.items() if k not in extra},
    )
    for key in extra:  # FedRGD's group averages and their members
        assert want[key]["client_group"] == got[key]["client_group"]
        for a, b in zip(want[key]["group_models"], got[key]["group_models"], strict=True):
            _assert_same(a, b)


def test_client_round_is_a_function_of_its_inputs(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _federation(fmnist_root, tmp_path / "run", method_kw={"loss": FixMatchLoss(tau=0.0)})
    fed.prepare()
    payload = fed.method.broadcast()
    first = fed.runner(payload, 1, 1, None)
    with torch.no_grad():  # the server's own network must not leak into a client's work
        for p in fed.method.network.parameters():
            p.fill_(float("nan"))
    second = fed.runner(payload, 1, 1, None)
    _assert_same(first.model, second.model)
    assert first.num_examples == 128 and first.state is None
    assert set(first.metrics) == {"loss", "mask_rate", "lr"}  # lr: the steps' mean rate
    other_round = fed.runner(payload, 1, 2, None)
    assert not torch.equal(first.model["head.0.weight"], other_round.model["head.0.weight"])


def test_client_labels_never_reach_the_client_loss(fmnist_root: Path, tmp_path: Path) -> None:
    def run(scramble: bool, name: str) -> dict[str, torch.Tensor]:
        fed = _federation(fmnist_root, tmp_path / name, server_epochs=1)
        fed.prepare()
        if scramble:  # replace every client label with garbage
            fed.data.pool.shards = [
                ImageSplit(c.images, torch.full_like(c.labels, 9)) for c in fed.data.clients
            ]
        fed.run()
        return _weights(fed)

    _assert_same(run(False, "true"), run(True, "scrambled"))


def test_oracle_is_marked_and_uses_labels(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert FedAvgSL.oracle and not FedAvgFixMatch.oracle and not ServerSL.oracle
    assert marks(FedAvgSL) == ("oracle",) and marks(FedAvgFixMatch) == ()

    class Sharing(FedAvgFixMatch):
        private = False

    assert marks(Sharing) == ("not private",)
    fed = _federation(fmnist_root, tmp_path / "run", FedAvgSL, rounds=1)
    fed.prepare()
    _, y = next(iter(fed.method.client_side().loader(fed.data.client_data(0))))
    assert y.dtype == torch.long
    fed.run()
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert "FedAvgSL is an oracle" in first  # announced as the run starts
    assert json.loads((tmp_path / "run" / "run.json").read_text())["marks"] == ["oracle"]


def test_bytes_counted_per_direction(fmnist_root: Path, tmp_path: Path) -> None:
    fed = _federation(fmnist_root, tmp_path / "fm", clients_per_round=3, rounds=1)
    final = fed.run().final
    model_bytes = state_bytes(fed.method.network.state_dict())
    assert final["comm/bytes_down"] == 3 * model_bytes
    assert final["comm/bytes_up"] == 3 * model_bytes
    server = _federation(fmnist_root, tmp_path / "sl", ServerSL, rounds=1).run().final
    assert server["comm/bytes_down"] == server["comm/bytes_up"] == 0


def test_logged_keys_and_checkpoint(fmnist_root: Path, tmp_path: Path) -> None:
    result = _federation(fmnist_root, tmp_path / "run").run()
    rows = _csv_rows(tmp_path / "run" / "metrics.csv")
    assert float(rows[0]["partition/R"]) == pytest.approx(0.0, abs=0.05)  # 12.8 per class
    for key in (
        "round",
        "test/acc",
        "test/loss",
        "time/round_s",
        "comm/bytes_down",
        "comm/bytes_up",
    ):
        assert rows[-1][key] != "", key
    ckpt = load_checkpoint(result.checkpoint)
    assert ckpt["round"] == 2
    assert {"method_state", "client_states", "rng", "history"} <= set(ckpt)


def test_existing_run_directory_is_never_overwritten(fmnist_root: Path, tmp_path: Path) -> None:
    _federation(fmnist_root, tmp_path / "run", rounds=1).run()
    before = (tmp_path / "run" / "metrics.csv").read_bytes()
    again = _federation(fmnist_root, tmp_path / "run", rounds=1)
    with pytest.raises(ValueError, match="trainer.default_root_dir"):
        again.prepare()
    assert (tmp_path / "run" / "metrics.csv").read_bytes() == before


def test_invalid_federation_settings(fmnist_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"federation\.clients_per_round"):
        _federation(fmnist_root, tmp_path / "r", clients_per_round=5).prepare()
    for key in ("rounds", "clients_per_round", "local_epochs", "server_epochs"):
        with pytest.raises(ValueError, match=rf"federation\.{key}"):
            replace(FederationConfig(), **{key: 0})


class _SignalsItself(LightningModule):
    """Sends itself SIGTERM where Lightning's loops no longer look for it: after the last
    training epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def on_train_end(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_sigterm_caught_by_a_per_step_trainer_stops_the_run() -> None:
    """A SIGTERM (a scheduler's time limit) that a per-step Trainer caught too late to act on
    still stops the federation instead of being forgotten with that Trainer."""
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(SIGTERMException):
        TrainerTemplate(accelerator="cpu").fit(_SignalsItself(), loader, epochs=1)


def test_client_hooks_get_only_the_clients_own_data(fmnist_root: Path, tmp_path: Path) -> None:
    """Privacy by construction: a method's client-side hooks receive the client's own shard
    (and loaders over it), never the data module with other clients' or the server's data."""
    seen: list[ClientData] = []

    fed = _federation(fmnist_root, tmp_path / "run", FedAvgFixMatch, rounds=1)
    fed.prepare()
    side = fed.runner.client
    for hook in ("loader", "objective"):
        original = getattr(side, hook)

        def recording(*args, _original=original):  # type: ignore[no-untyped-def]
            seen.append(next(a for a in args if isinstance(a, ClientData)))
            return _original(*args)

        setattr(side, hook, recording)
    fed.run()
    assert len(seen) == 4  # two clients, two hooks each
    for client in seen:
        assert isinstance(client, ClientData)
        own = fed.data.client_shard(client.client_id, client.visit)
        assert torch.equal(client.shard.images, own.images)
        # every tensor reachable from it is the client's own: its shard, no labeled set
        values = [getattr(client, f.name) for f in fields(client)]
        assert not any(isinstance(v, FederatedDataModule) for v in values)
        assert client.labeled is None and len(client) == len(own) == 128
        images = torch.cat([x for x, _ in client.dataloader(("weak", "strong"))])
        assert len(images) == 128


@pytest.mark.parametrize("version", [1, 2, 3])
def test_checkpoint_of_an_earlier_format_is_refused_naming_it(tmp_path: Path, version: int) -> None:
    old = tmp_path / "last.ckpt"
    torch.save({"format": f"fedlit-federation/{version}", "round": 3, "method_state": {}}, old)
    with pytest.raises(
        ValueError, match=f"earlier fedlit .fedlit-federation/{version}.*start the run again"
    ):
        load_checkpoint(old)


def test_run_checkpoint_writes_its_declared_fields_and_reads_them_back(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.ckpt"
    saved = RunCheckpoint(
        round=2,
        method_state={"network.weight": torch.arange(3.0)},
        client_states={0: 2, 3: 1},
        visits={0: 2, 3: 1},
        history=[{"round": 1.0, "test/acc": 0.25}, {"round": 2.0, "test/acc": 0.5}],
        rng={"torch": torch.tensor([1, 2], dtype=torch.uint8)},
        meta={"seed": 7, "method": "FedAvgFixMatch", "num_clients": 4, "dataset": "fmnist"},
        hparams={"federation.rounds": 3},
    )
    saved.save(path)
    raw = torch.load(path, weights_only=True)
    assert list(raw) == ["format", *(f.name for f in fields(RunCheckpoint))]
    assert raw["format"] == "fedlit-federation/4" and raw["visits"] == {0: 2, 3: 1}
    loaded = RunCheckpoint.load(path)
    assert torch.equal(loaded.method_state["network.weight"], torch.tensor([0.0, 1.0, 2.0]))
    assert (loaded.round, loaded.client_states, loaded.history) == (2, {0: 2, 3: 1}, saved.history)
    assert (loaded.meta, loaded.hparams) == (saved.meta, saved.hparams)


def test_run_checkpoint_missing_a_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    torch.save({"format": "fedlit-federation/4", "round": 1, "method_state": {}}, path)
    with pytest.raises(ValueError, match="not a complete fedlit checkpoint.*'client_states'"):
        RunCheckpoint.load(path)


def test_extra_callbacks_see_every_round_and_the_ending(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The callbacks see each round after it is done, the last one with the final encoder
    evaluation that the run makes after the last round (a step of the run, not a callback)."""
    seen: list[tuple[str, object]] = []

    def encoder_evaluated(self: Server) -> dict[str, float]:
        seen.append(("encoder evaluation", self.config.rounds))
        return {"eval/linear_acc": 0.5}

    class Recording(Callback):
        def on_run_start(self, run: RunView) -> None:
            seen.append(("start", run.start_round))

        def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
            assert run.checkpoint_path.is_file()  # after the default callbacks: checkpointed
            seen.append(("round", (round_idx, metrics["test/acc"], metrics.get("eval/linear_acc"))))

        def on_run_end(self, run: RunView, ending: str) -> None:
            seen.append(("end", ending))

    monkeypatch.setattr(Server, "evaluate_encoder", encoder_evaluated)
    fed = _federation(fmnist_root, tmp_path / "run")
    fed.extra_callbacks = [Recording()]
    fed.callbacks.items.extend(fed.extra_callbacks)
    result = fed.run()
    accs = [h["test/acc"] for h in result.history]
    assert seen == [
        ("start", 1),
        ("round", (1, accs[0], None)),
        ("encoder evaluation", 2),
        ("round", (2, accs[1], 0.5)),
        ("end", "success"),
    ]
    assert load_checkpoint(result.checkpoint)["history"][-1]["eval/linear_acc"] == 0.5


def test_the_round_of_a_checkpoint_of_any_format_is_read(tmp_path: Path) -> None:
    """A comparison tells a finished run of an earlier fedlit from one to resume."""
    from fedlit.federation.checkpoint import checkpoint_round

    old = tmp_path / "old.ckpt"
    torch.save({"format": "fedlit-federation/2", "round": 12, "method_state": {}}, old)
    assert checkpoint_round(old) == 12
    other = tmp_path / "other.ckpt"
    torch.save({"epoch": 3}, other)
    with pytest.raises(ValueError, match="not a fedlit federation checkpoint"):
        checkpoint_round(other)


def test_compile_setting_compiles_every_training_step_and_trains_as_eager(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``federation.compile`` compiles the whole step of every client and server fit (the
    views, the forward passes, the loss: :mod:`fedlit.federation.fit.compiled`) and only while it
    trains. Here torch.compile traces with its "eager" backend (the graphs torch captures, run
    by torch's own kernels: seconds instead of inductor's minutes of C++), so the weights must
    equal those of an eager run (both draw their views from the fit's own draws) but for
    the update's rounding: a one-call step
    (:class:`~fedlit.federation.fit.compiled.OneCallStep`) runs torch's functional SGD with the
    learning rate as a tensor, which multiplies and then adds (two roundings, where the eager
    optimiser's add rounds once); a round's steps carry that to up to 2e-5 in the weights and
    2e-4 in BatchNorm's running means here. The same compiled run again gives the same
    weights, bit for bit."""
    small = {"examples_per_client": 64, "test_subset": 100}
    eager = _federation(fmnist_root, tmp_path / "eager", data_kw=small, rounds=1)
    eager.run()
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    calls: list[str] = []
    original = compiled.compiled_step

    def recording(objective: Objective, mode: str) -> Any:
        calls.append(f"{type(objective).__name__}/{mode}")
        return original(objective, mode)

    monkeypatch.setattr(compiled, "compiled_step", recording)
    torch._dynamo.reset()
    fed = _federation(
        fmnist_root, tmp_path / "compiled", data_kw=small, rounds=1, compile="reduce-overhead"
    )
    fed.run()
    # 2 clients + the server's step + its fine-tuning step after aggregation
    assert calls == [
        "SupervisedCE/reduce-overhead",
        "FixMatch/reduce-overhead",
        "FixMatch/reduce-overhead",
        "SupervisedCE/reduce-overhead",
    ]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # dynamo did trace
    assert not torch._dynamo.utils.counters["graph_break"]
    for a, b in zip(_weights(eager).values(), _weights(fed).values(), strict=True):
        torch.testing.assert_close(a, b, atol=5e-4, rtol=1e-3)
    # the fits' own draws follow the run's seed: the same compiled run again, bit for bit
    again = _federation(
        fmnist_root, tmp_path / "again", data_kw=small, rounds=1, compile="reduce-overhead"
    )
    again.run()
    _assert_same(_weights(again), _weights(fed))


def test_compile_setting_refused_with_a_clear_error(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"federation\.compile.*'fast'"):
        FederationConfig(compile="fast")  # type: ignore[arg-type]

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("no such compiler")

    monkeypatch.setattr("fedlit.federation.checks.subprocess.run", no_compiler)
    fed = _federation(fmnist_root, tmp_path / "r", compile="default")
    with pytest.raises(ValueError, match=r"federation\.compile='default'.*C\+\+ compiler"):
        fed.prepare()
    assert not (tmp_path / "r").exists()
