"""How a module is fitted (:func:`fedlit.federation.fit.how_to_fit`): fedlit's objectives in
fedlit's own loop, to its own contract (its hooks, its order, its schedulers' rules), a user's
own LightningModule in a Lightning Trainer; what the loop does not take is refused by name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_overrides
from ray_runs import federation

from fedlit.cli import main
from fedlit.data.augment import FitDraws
from fedlit.data.datasets import SPECS
from fedlit.data.loaders import ImageBatches
from fedlit.federation import FederationConfig, RaySettings
from fedlit.federation.checks import check_trainer, checked_trainer
from fedlit.federation.fit import TrainerTemplate, how_to_fit
from fedlit.methods import FedAvgBYOL, FederatedMethod, FedSEAL, ServerSL, TSClientEMA
from fedlit.models import Architecture
from fedlit.objectives import SupervisedCE
from fedlit.objectives.schedules import WarmupCosine

CPU = TrainerTemplate(accelerator="cpu", precision="32-true")


def _count_trainers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    built: list[object] = []
    init = lightning.Trainer.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(lightning.Trainer, "__init__", counted)
    return built


def _loader(n: int = 40, batch: int = 8) -> ImageBatches:
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return ImageBatches(images, SPECS["fashion_mnist"], ("weak",), batch, True, labels=labels)


def _reference(
    network: torch.nn.Module, clip: float | None, epochs: int, batches: int | None
) -> torch.nn.Module:
    """The loop's contract written out in torch: the fit's draws made first (one draw of
    torch's generator seeds them), then per batch its views, CE, zero_grad, backward,
    clipping by norm, SGD's step."""
    torch.manual_seed(3)
    draws = FitDraws()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9, foreach=True)
    for _ in range(epochs):
        for k, raw in enumerate(_loader().on_device(torch.device("cpu"))):
            if batches is not None and k == batches:
                break
            x, y = raw.draw(draws).expand()
            loss = F.cross_entropy(network(x).float(), y)
            optimizer.zero_grad()
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(list(network.parameters()), clip)
            optimizer.step()
    return network


@pytest.mark.parametrize(
    ("settings", "epochs", "batches"),
    [({}, 2, None), ({"gradient_clip_val": 0.01}, 1, None), ({"limit_train_batches": 3}, 2, 3)],
)
def test_an_objective_fits_as_the_loops_contract_says(
    settings: dict[str, Any], epochs: int, batches: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fedlit's loop against its contract written out in torch: the same weights bit for
    bit, and no Trainer built."""
    torch.manual_seed(0)
    network = Architecture(10, 1).build()
    objective = SupervisedCE(copy.deepcopy(network), lr=0.1, momentum=0.9)
    built = _count_trainers(monkeypatch)
    torch.manual_seed(3)
    TrainerTemplate(accelerator="cpu", precision="32-true", **settings).fit(
        objective, _loader(), epochs
    )
    assert built == []
    reference = _reference(network, settings.get("gradient_clip_val"), epochs, batches)
    torch.testing.assert_close(
        objective.network.state_dict(), reference.state_dict(), rtol=0, atol=0
    )
    assert objective.steps_taken() == epochs * (batches or 5)


class Ordered(SupervisedCE):
    """Records the loop's calls of its methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def configure_optimizers(self) -> Any:
        self.calls.append("configure_optimizers")
        return super().configure_optimizers()

    def before_fit(self) -> None:
        self.calls.append("before_fit")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append("training_step")
        return super().training_step(batch, batch_idx)

    def after_step(self) -> None:
        self.calls.append(f"after_step {self.steps_taken()}/{self.planned_steps()}")

    def after_fit(self) -> None:
        self.calls.append("after_fit")


def test_the_loop_calls_the_objectives_hooks_in_its_documented_order() -> None:
    objective = Ordered(Architecture(10, 1).build(), lr=0.1)
    CPU.fit(objective, _loader(n=16), epochs=2)
    steps = [c for k in range(1, 5) for c in ("training_step", f"after_step {k}/4")]
    assert objective.calls == ["configure_optimizers", "before_fit", *steps, "after_fit"]


class Scheduled(SupervisedCE):
    """An objective whose ``configure_optimizers`` returns ``lr_scheduler`` (a scheduler, or
    its settings), recording the learning rate each step used."""

    def __init__(self, scheduler: Any, **kw: Any) -> None:
        super().__init__(Architecture(10, 1).build(), lr=0.1, momentum=0.0)
        self.make, self.kw, self.used = scheduler, kw, []

    def configure_optimizers(self) -> Any:
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = self.make(self.optimizer)
        if scheduler is None or not self.kw:
            return {"optimizer": self.optimizer, "lr_scheduler": scheduler}
        return {"optimizer": self.optimizer, "lr_scheduler": {"scheduler": scheduler, **self.kw}}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.used.append(self.optimizer.param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)


def _halving(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


@pytest.mark.parametrize(
    ("kw", "used"),
    [
        ({}, [0.1, 0.1, 0.05, 0.05]),  # a bare scheduler: every epoch, after its last step
        ({"interval": "epoch"}, [0.1, 0.1, 0.05, 0.05]),
        ({"interval": "step"}, [0.1, 0.05, 0.025, 0.0125]),
        ({"interval": "step", "frequency": 2}, [0.1, 0.1, 0.05, 0.05]),
        ({"interval": "epoch", "frequency": 2}, [0.1, 0.1, 0.1, 0.1]),
    ],
)
def test_schedulers_step_by_the_loops_rule(kw: dict[str, Any], used: list[float]) -> None:
    """Two epochs of two batches, StepLR halving at each of its steps: the learning rate each
    optimiser step used (an epoch's steps all use one: a Trainer gives [0.1, 0.05, 0.05,
    0.025] for the epoch interval, stepping before the last batch's end)."""
    objective = Scheduled(_halving, **kw)
    CPU.fit(objective, _loader(n=16), epochs=2)
    assert objective.used == pytest.approx(used)
    assert objective.epoch_metrics()["lr"] == pytest.approx(sum(used) / 4)


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        (lambda o: ([o], [_halving(o)]), "returned tuple"),
        (lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o), "returned ReduceLROnPlateau"),
        (lambda o: {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o)},
         "a ReduceLROnPlateau"),
        (lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": _halving(o), "monitor": "loss"}},
         "lr_scheduler.monitor"),
        (lambda o: {"optimizer": o, "monitor": "loss"}, "returned monitor"),
        (lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": _halving(o), "frequency": 0}},
         "frequency=0"),
    ],
)
def test_optimiser_settings_the_loop_does_not_take_are_refused_before_any_step(
    returned: Any, named: str
) -> None:
    class Configured(SupervisedCE):
        def configure_optimizers(self) -> Any:
            return returned(torch.optim.SGD(self.parameters(), lr=0.1))

    objective = Configured(Architecture(10, 1).build(), lr=0.1)
    before = copy.deepcopy(objective.network.state_dict())
    with pytest.raises(ValueError, match=f"Configured.configure_optimizers.*{named}"):
        CPU.fit(objective, _loader(n=16), epochs=1)
    torch.testing.assert_close(objective.network.state_dict(), before, rtol=0, atol=0)


class OwnModule(lightning.LightningModule):
    """A user's own LightningModule: its own training_step, logging with ``self.log``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class OwnStep(SupervisedCE):
    """A fedlit objective overriding Lightning hooks fedlit's loop does not call."""

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)

    def on_train_batch_end(self, *args: Any) -> None:
        pass


def test_a_users_own_module_trains_in_a_trainer_and_an_objective_never_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's module: a Trainer, its ``self.log`` values the fit's metrics (the server step
    reads them: a plain module as the server objective once raised AttributeError). An
    objective overriding a Lightning hook the loop does not call: refused, naming the hooks,
    with its weights untouched."""
    built = _count_trainers(monkeypatch)
    module = OwnModule()
    assert how_to_fit(module, CPU) == "trainer"
    before = module.layer.weight.detach().clone()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), 4)
    metrics = CPU.fit(module, loader, epochs=1)
    assert len(built) == 1 and not torch.equal(module.layer.weight, before)
    assert set(metrics) == {"loss"} and metrics["loss"] > 0
    own = OwnStep(Architecture(10, 1).build(), lr=0.1)
    weights = copy.deepcopy(own.network.state_dict())
    with pytest.raises(ValueError, match="OwnStep overrides on_train_batch_end, optimizer_step"):
        CPU.fit(own, _loader(), epochs=1)
    torch.testing.assert_close(own.network.state_dict(), weights, rtol=0, atol=0)
    with pytest.raises(ValueError, match="federation.compile='default': OwnModule"):
        how_to_fit(module, TrainerTemplate(accelerator="cpu", compile="default"))


@pytest.mark.parametrize(
    "precision", ["64", "64-true", "16-true", "bf16-true", "transformer-engine"]
)
def test_precisions_the_loop_does_not_take_are_refused_by_name(precision: str) -> None:
    """They once reached a Trainer that converted the input before fedlit made the views on
    the device, and ended in a dtype mismatch's traceback."""
    with pytest.raises(ValueError, match=f"trainer.precision='{precision}'"):
        check_trainer(TrainerTemplate(accelerator="cpu", precision=precision))


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"accumulate_grad_batches": 2}, "accumulate_grad_batches=2"), ({"strategy": "ddp"}, "")],
)
def test_other_settings_the_loop_does_not_take_are_refused_by_name(
    settings: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=f"trainer.{named or next(iter(settings))}"):
        check_trainer(TrainerTemplate(accelerator="cpu", **settings))


def test_a_fraction_of_batches_that_leaves_none_is_refused() -> None:
    """``limit_train_batches`` 0.001 of 5 batches is none: refused naming it, as Lightning
    refuses it (it once trained nothing and reported a client that contributed)."""
    objective = SupervisedCE(Architecture(10, 1).build(), lr=0.1)
    with pytest.raises(ValueError, match=r"trainer.limit_train_batches=0.001.*at least 0.2"):
        TrainerTemplate(accelerator="cpu", limit_train_batches=0.001).fit(
            objective, _loader(), epochs=1
        )
    assert objective.steps_taken() == 0


def test_16_mixed_on_a_cpu_is_bf16_mixed_as_lightning_has_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    template = TrainerTemplate(accelerator="cpu", precision="16-mixed")
    assert template.resolved().precision == "bf16-mixed"
    checked = checked_trainer(template, ServerSL(Architecture(10, 1)), FederationConfig())
    assert checked.precision == "bf16-mixed"
    assert "trainer.precision='16-mixed' on a CPU: bf16-mixed" in capsys.readouterr().err
    assert template.loop().autocast() == ("cpu", torch.bfloat16)


class Poisoned(SupervisedCE):
    """A loss whose backward computes NaN (the gradient of sqrt at 0)."""

    def step(self, batch: Any) -> Any:
        loss = torch.sqrt(self.network(batch[0]).sum() * 0.0)
        return loss, ((1.0, {"loss": loss}),)


def test_detect_anomaly_stops_at_the_backward_that_gave_nan() -> None:
    template = TrainerTemplate(accelerator="cpu", precision="32-true", detect_anomaly=True)
    with pytest.raises(RuntimeError, match="returned nan values"):
        template.fit(Poisoned(Architecture(10, 1).build(), lr=0.1), _loader(), epochs=1)
    CPU.fit(quiet := Poisoned(Architecture(10, 1).build(), lr=0.1), _loader(), epochs=1)
    assert quiet.steps_taken() == 5  # without it, the NaN goes unnoticed


def test_the_private_torch_names_the_compiled_fit_reads_are_there() -> None:
    """The compiled fit calls these three of torch's private modules (torch is bounded in
    setup.cfg): this fails where a torch release moves one."""
    assert isinstance(torch._dynamo.config.trace_autograd_ops, bool)
    assert callable(torch._dynamo.mark_static_address)
    assert isinstance(torch._inductor.list_mode_options("default"), dict)


@pytest.mark.parametrize("cls", [FedSEAL, TSClientEMA, FedAvgBYOL])
def test_a_federation_builds_no_trainer(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds of FedSEAL, TS-Client EMA and FedAvg-BYOL: not one Trainer built after the
    set-up's check of the settings (server and client fits, evaluations), and they train."""
    built = _count_trainers(monkeypatch)
    run = federation(str(fmnist_root), tmp_path / "run", cls, "local", RaySettings())
    run.trainer = TrainerTemplate(accelerator="cpu")
    run.prepare()
    built.clear()
    run.run()
    assert built == []
    assert len(run.history) == 2 and all(h["test/acc"] > 0 for h in run.history)


def test_the_template_takes_two_passes_a_step_in_bf16() -> None:
    """A step that calls the network twice under bf16 autocast trains (autocast's weight
    cache off: each pass casts its weights)."""

    class TwoPasses(SupervisedCE):
        def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
            x, y = batch
            loss = (
                F.cross_entropy(self.network(x).float(), y)
                + F.cross_entropy(self.network(x.flip(-1)).float(), y)
            ) / 2
            return loss, ((len(y), {"loss": loss}),)

    network = Architecture(10, 1).build()
    before = copy.deepcopy(network.state_dict())
    objective = TwoPasses(network, lr=0.1, schedule=WarmupCosine(warmup=0.2))
    TrainerTemplate(accelerator="cpu", precision="bf16-mixed").fit(objective, _loader(), 1)
    assert any(not torch.equal(v, before[k]) for k, v in network.state_dict().items())


class PlainServerStep(lightning.LightningModule):
    """A user's own server objective: CE on the server's batches, logged with ``self.log``."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = network

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.network(x), y)
        self.log("ce", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class ServerSLOwnStep(ServerSL):
    """Server-SL whose server step is the user's own LightningModule."""

    def server_objective(self) -> Any:
        return PlainServerStep(self.network)


def test_a_users_plain_module_as_the_server_objective_trains_in_a_trainer(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """It once ended in AttributeError (no epoch_metrics) after its fit: now its ``self.log``
    values are the server step's metrics, and the network trains."""
    run = federation(str(fmnist_root), tmp_path / "run", ServerSLOwnStep, "local", RaySettings())
    run.trainer = TrainerTemplate(accelerator="cpu")
    before = copy.deepcopy(run.method.network.state_dict())
    run.run()
    assert all(h["server/ce"] > 0 for h in run.history)
    after = run.method.network.state_dict()
    assert any(not torch.equal(v, before[k]) for k, v in after.items())


@pytest.mark.parametrize(
    ("method", "recipe", "named"),
    [
        ("Lists", "fedavg_fixmatch", "ListsFixMatch.configure_optimizers returned tuple"),
        ("Plateau", "fedavg_fixmatch", "PlateauFixMatch.configure_optimizers returned Reduce"),
        ("Monitor", "fedavg_fixmatch", "MonitorFixMatch.configure_optimizers returned monitor"),
        ("ServerPlateau", "server_sl", "PlateauCE.configure_optimizers returned a ReduceLR"),
        ("Hooked", "fedavg_fixmatch", "HookedFixMatch overrides on_before_zero_grad"),
        ("ServerManual", "server_sl", "ManualCE.automatic_optimization is False"),
    ],
)
def test_fedlit_fit_refuses_optimiser_settings_the_loop_does_not_take_before_writing(
    method: str,
    recipe: str,
    named: str,
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fedlit fit`` of a method whose server's or clients' objective returns, from
    ``configure_optimizers``, what the loop does not take: exit 2 naming the objective's
    class and what it returned, and the run directory holds nothing the run writes."""
    run_dir = tmp_path / "run"
    argv = [
        "fit",
        f"--config={Path(__file__).parents[1] / 'recipes' / recipe}.yaml",
        f"--model.class_path=own_optimizers.{method}",
        *tiny_overrides(fmnist_root),
        f"--trainer.default_root_dir={run_dir}",
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert named in err, err
    assert "Traceback" not in err, err
    written = [p.name for p in run_dir.rglob("*")] if run_dir.exists() else []
    assert not {"config.yaml", "metrics.csv", "run.json"} & set(written), written


def test_only_fedlits_evaluator_is_tested() -> None:
    """``TrainerTemplate.test`` runs fedlit's evaluator; another module is refused by name
    before it runs (a Trainer no longer tests anything)."""

    class Mine(lightning.LightningModule):
        pass

    with pytest.raises(TypeError, match="Mine: test runs fedlit's Evaluator only"):
        TrainerTemplate(accelerator="cpu").test(Mine(), [])  # type: ignore[arg-type]
