"""``federation.compile``: each method's whole training step as one compiled graph.

The graphs' breaks and count are dynamo's (the same whatever backend runs them): those tests
trace with the ``aot_eager`` backend (forward and backward graphs, eager kernels, no code
generation), to keep the suite fast. The numbers test runs inductor's real kernels.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from conftest import tiny_overrides
from test_one_call_step import SmoothNet
from torch._dynamo.utils import counters

from fedlit.cli.fit import federation_of
from fedlit.data import ImageBatches, dataset_spec, load_split
from fedlit.data.augment import FitDraws
from fedlit.federation.fit import compiled, loop, settings
from fedlit.federation.callbacks import Callback, RunView
from fedlit.federation.fit.compiled import whole_step_compiled
from fedlit.models import build_classifier
from fedlit.objectives import FitState, FixMatch, FixMatchLoss, Objective, SupervisedCE
from fedlit.resolver import resolve

REPO = Path(__file__).parents[1]
#: Paper 002's Table 1: their client and server steps compile whole, with no graph break.
TABLE_1 = ("server_sl", "fedavg_sl", "fedavg_fixmatch", "fedavg_uda", "fedseal")


class Frames(Callback):
    """The frames dynamo has compiled, after each round."""

    def __init__(self) -> None:
        self.after: dict[int, int] = {}

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        self.after[round_idx] = counters["stats"]["unique_graphs"]


class StaticInputs:
    """Wraps ``whole_step_compiled``: after every compiled fit, the tensors the step read as
    static inputs (dynamo marks them: a module's parameters, buffers and tensor attributes),
    by objective class and network, and every name whose tensor a later fit of the same
    class and network replaced (a CUDA graph records a static input's memory: a new tensor
    records the graphs anew)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.replaced: set[str] = set()
        self.fits = 0

    @contextmanager
    def __call__(self, module: Objective, mode: str) -> Iterator[dict[str, Any]]:
        with whole_step_compiled(module, mode) as fields:
            yield fields
        self.fits += 1
        key = (type(module).__name__, id(module.network))
        now = {
            f"{type(module).__name__}{'.' if name else ''}{name}.{attr}": value
            for name, sub in module.named_modules()
            for attr, value in [*vars(sub).items(), *sub._parameters.items(), *sub._buffers.items()]
            if isinstance(value, torch.Tensor)
        }
        for name, value in self.last.get(key, {}).items():
            if now.get(name) is not value:
                self.replaced.add(name)
        self.last[key] = {n: v for n, v in now.items() if hasattr(v, "_dynamo_static_input_type")}


def compiled_run(
    recipe: str,
    root: Path,
    run_dir: Path,
    clients: int,
    rounds: int,
    static: StaticInputs | None = None,
) -> Frames:
    torch._dynamo.reset()
    counters.clear()
    frames = Frames()
    args = [
        "--config",
        str(REPO / "recipes" / f"{recipe}.yaml"),
        *tiny_overrides(root, rounds=rounds, test_subset=50),
        f"--data.num_clients={clients}",
        f"--federation.clients_per_round={clients}",
        f"--trainer.default_root_dir={run_dir}",
        "--federation.compile=default",
    ]
    federation = federation_of(resolve(args), progress=False, extra_callbacks=[frames])
    with pytest.MonkeyPatch.context() as patch:
        if static is not None:
            patch.setattr(settings, "whole_step_compiled", static)
        federation.run()  # prepares, locks the run directory, runs, closes
    return frames


@pytest.mark.parametrize("recipe", [*TABLE_1, "semifl"])
def test_whole_step_compiles_without_a_break_once_per_objective_and_network(
    recipe: str, fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every client and server step of the run is traced whole (``fullgraph=True``: a break
    would raise), and the count of compiled graphs is set by the run's first round: it does
    not grow with rounds, nor with clients (the persistent networks: one per worker). The
    last round adds the final evaluation's protocols where the recipe asks for them
    (``federation.final_eval``: fine-tuning and a linear probe, each compiled once)."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    two = compiled_run(recipe, fmnist_root, tmp_path / "two", clients=2, rounds=1)
    static = StaticInputs()
    four = compiled_run(recipe, fmnist_root, tmp_path / "four", clients=4, rounds=3, static=static)
    assert not counters["graph_break"]
    assert four.after[1] >= (1 if recipe == "server_sl" else 2)  # the server's, the clients'
    assert four.after[2] == four.after[1]
    assert four.after[3] == two.after[1]  # the same run end, with twice the clients
    # and the graphs' static inputs are the same tensors in every fit: a CUDA graph recorded
    # once replays for every client and round (FedSEAL's sets and lambda: step_input's slots)
    assert static.fits >= 3
    assert not static.replaced


def test_compiled_steps_equal_eager_ones_to_float32_rounding(fmnist_root: Path) -> None:
    """Three FixMatch client steps and three server steps from the same weights and the same
    draws (a compiled fit's :class:`~fedlit.data.augment.FitDraws`, set for the eager run
    too), eager and compiled by inductor: the compiled steps are as close to the same steps
    run eagerly in float64 as the eager float32 steps are (4x their measured error: the
    greatest of thousands of rounding errors varies from one run to another), in the losses
    and in every weight and buffer, where the steps move the weights a thousand times more.

    Why not bit for bit: inductor fuses the views, the loss and the backward into kernels that
    sum float32 terms in another order, and the optimiser is the fused one. The network is
    smooth (:class:`~test_one_call_step.SmoothNet`): with ReLU and max pooling two float32 runs
    that differ by a rounding can cross a kink and part by far more, on some CPUs and thread
    counts."""
    images = load_split("fashion_mnist", fmnist_root, train=False, download=False).images[:96]
    labels = torch.arange(96) % 10
    spec = dataset_spec("fashion_mnist")
    torch.manual_seed(0)
    network = SmoothNet()

    def run(
        objective_type: type, mode: str | None, dtype: torch.dtype = torch.float32
    ) -> tuple[list[float], torch.nn.Module]:
        torch.manual_seed(1)  # the same batches and the same views' draws for both:
        fit_draws = FitDraws()  # a compiled fit's, given to the eager run too
        net = copy.deepcopy(network).to(dtype)
        if objective_type is FixMatch:
            objective = FixMatch(net, lr=0.03, loss=FixMatchLoss(tau=0.0))  # every image
            loader = ImageBatches(images, spec, ("weak", "strong"), 16, shuffle=True)
        else:
            objective = SupervisedCE(net, lr=0.03)
            loader = ImageBatches(images, spec, ("weak",), 16, shuffle=True, labels=labels)
        step = None if mode is None else compiled.compiled_step(objective, mode)
        objective.fit_state = FitState(draws=fit_draws, compiled_step=step)
        optimizer, _ = objective.optimizer_and_scheduler(3)
        losses = []
        for k, raw in enumerate(loader.on_device()):
            if k == 3:
                break
            batch = loop.views(raw, torch.device("cpu"), objective.fit_state)
            loss = objective.training_step(batch, k)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, net

    for objective_type in (FixMatch, SupervisedCE):
        reference_losses, reference = run(objective_type, None, torch.float64)
        eager_losses, eager = run(objective_type, None)
        compiled_losses, fast = run(objective_type, "default")
        exact = {k: v for k, v in reference.state_dict().items() if v.is_floating_point()}
        error = max(
            (eager.state_dict()[k].double() - v).abs().max().item() for k, v in exact.items()
        )
        for k, v in exact.items():
            torch.testing.assert_close(fast.state_dict()[k].double(), v, rtol=0, atol=4 * error)
        assert fast.state_dict().keys() == reference.state_dict().keys()
        for ours, eager_loss, exact_loss in zip(
            compiled_losses, eager_losses, reference_losses, strict=True
        ):
            bound = 4 * max(abs(eager_loss - exact_loss), error)
            assert ours == pytest.approx(exact_loss, rel=0, abs=bound), objective_type
        # and the steps did train: the weights moved far more than the rounding
        moved = max(
            (a.float() - b.float()).abs().max().item()
            for a, b in zip(network.state_dict().values(), eager.state_dict().values(), strict=True)
        )
        assert moved > 1e3 * error


def test_fedmatch_refuses_a_compiled_step_before_any_work(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """FedMatch trains a network built for each step (sigma + psi parametrizations): every
    step would compile anew, so ``federation.compile`` is refused, naming the key, before the
    data are loaded or anything is written."""
    args = [
        "--config",
        str(REPO / "recipes" / "fedmatch.yaml"),
        *tiny_overrides(fmnist_root),
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--federation.compile=default",
    ]
    federation = federation_of(resolve(args), progress=False)
    with pytest.raises(ValueError, match=r"federation\.compile='default': FedMatch builds"):
        federation.prepare()
    assert not (tmp_path / "run").exists()


def test_step_input_is_the_value_eager_and_one_slot_overwritten_in_place_compiled() -> None:
    """Eager, ``step_input`` sets the value itself. Compiled (the fit state's slots), every
    objective of the worker gets the same slot, the value copied into it: a shorter value
    fills the first rows (the step indexes no further), a longer one or another dtype takes a
    new slot."""
    torch.manual_seed(0)
    network = build_classifier("small_cnn", 10, 1)
    eager = SupervisedCE(network, lr=0.1)
    value = torch.tensor([3, 1, 4])
    eager.step_input("pseudo", value)
    assert eager.pseudo is value

    slots: dict[str, torch.Tensor] = {}
    first, second = SupervisedCE(network, lr=0.1), SupervisedCE(network, lr=0.1)
    first.fit_state, second.fit_state = FitState(slots=slots), FitState(slots=slots)
    first.step_input("pseudo", torch.tensor([3, 1, 4]))
    first.step_input("lam", torch.tensor(0.5))
    second.step_input("pseudo", torch.tensor([2, 7]))
    second.step_input("lam", torch.tensor(0.25))
    assert second.pseudo is first.pseudo is slots["pseudo"]
    assert second.pseudo.tolist() == [2, 7, 4]  # the first two rows are the new value's
    assert second.lam is first.lam and second.lam.item() == 0.25
    second.step_input("pseudo", torch.tensor([5, 6, 7, 8]))  # longer: a new slot
    assert second.pseudo is slots["pseudo"] and second.pseudo is not first.pseudo
    assert second.pseudo.tolist() == [5, 6, 7, 8]
    second.step_input("lam", torch.tensor(1.0, dtype=torch.float64))  # another dtype
    assert second.lam.dtype == torch.float64 and second.lam is not first.lam
