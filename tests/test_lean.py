"""The lean loop: fedlit's objectives fit, and its evaluator tests, without a Lightning Trainer,
to the same weights bit for bit; a module the loop cannot run the same way goes to a Trainer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import torch.nn.functional as F
from ray_runs import differences, federation

from fedlit.data.datasets import SPECS
from fedlit.data.loaders import ImageBatches
from fedlit.federation import RaySettings
from fedlit.federation.fit import TrainerTemplate
from fedlit.methods import FedAvgBYOL, FederatedMethod, FedSEAL, TSClientEMA
from fedlit.models import Architecture
from fedlit.objectives import SupervisedCE
from fedlit.objectives.schedules import WarmupCosine


def _count_trainers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    built: list[object] = []
    init = lightning.Trainer.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(lightning.Trainer, "__init__", counted)
    return built


def _trainer_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TrainerTemplate, "lean", lambda self, module, lean_module: None)


def _loader(n: int = 40, batch: int = 8) -> ImageBatches:
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return ImageBatches(images, SPECS["fashion_mnist"], ("weak",), batch, True, labels=labels)


class TwoPasses(SupervisedCE):
    """CE on the images and on their mirror images: the network called twice a step."""

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        x, y = batch
        loss = (
            F.cross_entropy(self.network(x), y) + F.cross_entropy(self.network(x.flip(-1)), y)
        ) / 2
        return loss, ((len(y), {"loss": loss}),)


def _fit(template: TrainerTemplate, objective: SupervisedCE, **length: Any) -> dict[str, Any]:
    torch.manual_seed(3)
    template.fit(objective, _loader(), **length)
    return {"state": objective.network.state_dict(), "metrics": objective.epoch_metrics()}


CASES = {
    "plain": ({}, {}, {"epochs": 2}),
    "a schedule": ({}, {"schedule": WarmupCosine(warmup=0.2)}, {"epochs": 2}),
    "clipping": ({"gradient_clip_val": 0.01}, {}, {"epochs": 1}),
    "clipping by value": (
        {"gradient_clip_val": 0.001, "gradient_clip_algorithm": "value"},
        {},
        {"epochs": 1},
    ),
    "steps over epochs": ({}, {"schedule": WarmupCosine()}, {"epochs": 1, "max_steps": 11}),
    "fewer batches": ({"limit_train_batches": 3}, {}, {"epochs": 2}),
    "bf16 mixed": ({"precision": "bf16-mixed"}, {}, {"epochs": 1}),
    "bf16 mixed, two passes a step": ({"precision": "bf16-mixed"}, {}, {"epochs": 1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_objective_fits_without_a_trainer_as_in_one(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, objective_kw, length = CASES[case]
    template = TrainerTemplate(accelerator="cpu", **{"precision": "32-true", **settings})
    torch.manual_seed(0)
    network = Architecture(10, 1).build()
    initial = copy.deepcopy(network.state_dict())
    kind = TwoPasses if "two passes" in case else SupervisedCE
    objective = kind(copy.deepcopy(network), lr=0.1, momentum=0.9, **objective_kw)
    assert template.lean(objective, True) is not None
    built = _count_trainers(monkeypatch)
    lean = _fit(template, objective, **length)
    assert built == []  # no Trainer
    _trainer_every_time(monkeypatch)
    trained = _fit(template, kind(network, lr=0.1, momentum=0.9, **objective_kw), **length)
    assert len(built) == 1
    torch.testing.assert_close(lean["state"], trained["state"], rtol=0, atol=0)
    assert lean["metrics"] == trained["metrics"]
    assert any(not torch.equal(v, initial[k]) for k, v in lean["state"].items())  # it trained


@pytest.mark.parametrize("cls", [FedSEAL, TSClientEMA, FedAvgBYOL])
def test_a_federation_without_trainers_gives_the_weights_of_one_with_them(
    cls: type[FederatedMethod], fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds of FedSEAL (a bootstrap, thresholds, the self-ensemble's client state), of
    TS-Client EMA (a teacher updated after each step) and of FedAvg-BYOL (a momentum schedule
    read from the fit's steps): the same weights, client states and accuracies, and not one
    Trainer built after the set-up's check of the settings (server and client fits,
    evaluations)."""
    built = _count_trainers(monkeypatch)
    lean = federation(str(fmnist_root), tmp_path / "lean", cls, "local", RaySettings())
    lean.trainer = TrainerTemplate(accelerator="cpu")
    lean.prepare()
    built.clear()
    lean.run()
    assert built == []
    _trainer_every_time(monkeypatch)
    trained = federation(str(fmnist_root), tmp_path / "trainer", cls, "local", RaySettings())
    trained.trainer = TrainerTemplate(accelerator="cpu")
    trained.run()
    assert len(built) > 10
    assert differences(lean, trained) == []
    assert [h["test/acc"] for h in lean.history] == [h["test/acc"] for h in trained.history]


class OwnModule(lightning.LightningModule):
    """A user's own LightningModule: no fedlit step, its own training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class OwnStep(SupervisedCE):
    """A fedlit objective that takes its optimiser's step itself: a hook the lean loop does
    not call."""

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self.stepped = True
        super().optimizer_step(*args, **kwargs)


def test_a_users_own_module_still_trains_in_a_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_trainers(monkeypatch)
    template = TrainerTemplate(accelerator="cpu", precision="32-true")
    module = OwnModule()
    before = module.layer.weight.detach().clone()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), 4)
    template.fit(module, loader, epochs=1)
    assert len(built) == 1 and not torch.equal(module.layer.weight, before)
    own = OwnStep(Architecture(10, 1).build(), lr=0.1)
    assert template.lean(own, True) is None
    template.fit(own, _loader(), epochs=1)
    assert len(built) == 2 and own.stepped


def test_settings_the_lean_loop_does_not_take_go_to_a_trainer() -> None:
    objective = SupervisedCE(Architecture(10, 1).build(), lr=0.1)
    for settings in (
        {"accumulate_grad_batches": 2},
        {"detect_anomaly": True},
        {"deterministic": True},
        {"precision": "64-true"},
    ):
        template = TrainerTemplate(accelerator="cpu", **{"precision": "32-true", **settings})
        assert template.lean(objective, True) is None, settings
    assert TrainerTemplate(accelerator="cpu").lean(objective, True) is not None
