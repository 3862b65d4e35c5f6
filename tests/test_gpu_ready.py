"""What a first GPU user meets, checked without a GPU: CUDA faked where only fedlit's own
decisions are under test (the precision, the device, the refusals, a comparison's GPUs), the
CUDA generator's seeding recorded, and fp16's loop run on a CPU gradient scaler."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fit_loop import _loader

from fedlit.data.augment import FitDraws
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.federation.checks import check_trainer, compile_toolchain_missing
from fedlit.federation.fit import TrainerTemplate, compiled, default_precision, loop
from fedlit.federation.fit.compiled import whole_step_compiled
from fedlit.federation.seeding import rng_states, set_rng_states
from fedlit.methods.client_side import PersistentNetwork
from fedlit.models import Architecture
from fedlit.objectives import SupervisedCE
from fedlit.objectives.base import KeptOptimizers
from fedlit.objectives.schedules import WarmupCosine


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``fake_cuda(count, capability)``: torch sees ``count`` CUDA GPUs of ``capability``
    (whose emulated bf16 ``is_bf16_supported`` counts, as torch's default does)."""

    def install(count: int = 1, capability: tuple[int, int] = (7, 5)) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)

    return install


# --- 1. the default precision of a pre-Ampere GPU --------------------------------------------
@pytest.mark.parametrize(
    ("capability", "expected"),
    [((7, 5), "16-mixed"), ((7, 0), "16-mixed"), ((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed")],
)
def test_a_gpu_without_native_bf16_defaults_to_16_mixed(
    fake_cuda: Any, capability: tuple[int, int], expected: str
) -> None:
    """A T4 (7.5) or V100 (7.0) trains in fp16 mixed with the precision unset, though torch's
    ``is_bf16_supported()`` says yes there (emulation); an A100 (8.0) or H100 in bf16."""
    fake_cuda(capability=capability)
    assert default_precision("auto") == expected
    assert TrainerTemplate().decided_precision() == expected
    assert default_precision("cpu", cpu_bf16=False) == "32-true"


# --- 2. the tune report's scoring: the network on the images' device --------------------------
def test_the_tune_reports_scoring_puts_the_network_on_the_images_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``val_correct`` loads the run's network to the CPU and sends the images to the
    trainer's device: a spy network records where its weights and its inputs are (the
    ``meta`` device standing for a GPU)."""
    import fedlit.evaluation
    import fedlit.federation
    import fedlit.resolver
    from fedlit.comparison.selection import val_correct

    seen: list[tuple[str, str]] = []

    class Spy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append((x.device.type, self.weight.device.type))
            return torch.zeros(x.shape[0], 10)

    class Data:
        def setup_federation(self, seed: int) -> None:
            pass

        def val_dataloader(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
            return [(torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))]

    class Model:
        def load_state_dict(self, state: Any) -> None:
            pass

        def eval_network(self) -> torch.nn.Module:
            return Spy()

    class Trainer:
        def device(self) -> torch.device:
            return torch.device("meta")

    class Cli:
        model, datamodule, trainer = Model(), Data(), Trainer()

    monkeypatch.setattr(fedlit.resolver, "resolve", lambda args: Cli())
    monkeypatch.setattr(fedlit.federation, "load_checkpoint", lambda path: {"method_state": {}})
    monkeypatch.setattr(fedlit.evaluation, "scored", lambda net, data, device: net)  # as loaded
    right = val_correct([], tmp_path, 0)
    assert seen == [("meta", "meta")]
    assert right.tolist() == [True] * 4


# --- 3. building a worker's network leaves the GPUs' generators alone -------------------------
def test_building_a_persistent_network_seeds_no_gpu_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torch.manual_seed`` inside the build's fork re-seeded every CUDA generator to 0 and
    left it there (the fork restores the CPU's only): recorded, no seeding but the run's own.
    The network is the one ``torch.manual_seed(0)`` builds, the CPU generator untouched."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    torch.manual_seed(12345)
    before = torch.get_rng_state()
    built = PersistentNetwork.build(Architecture(10, 1)).network
    assert calls == [12345]
    assert torch.equal(torch.get_rng_state(), before)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)
        expected = Architecture(10, 1).build()
    torch.testing.assert_close(built.state_dict(), expected.state_dict(), rtol=0, atol=0)


# --- 4. trainer.devices and the accelerator ---------------------------------------------------
@pytest.mark.parametrize(("devices", "index"), [([1], 1), ("1,", 1), ([0], 0), (1, 0), ("auto", 0)])
def test_the_gpu_trainer_devices_names_is_the_one_trained_on(
    fake_cuda: Any, devices: Any, index: int
) -> None:
    fake_cuda(count=2)
    template = TrainerTemplate(devices=devices)
    assert template.loop().device == torch.device("cuda", index)
    if isinstance(devices, (list, str)) and devices != "auto":
        assert template.device() == torch.device("cuda", index)


def test_an_accelerator_or_gpu_fedlit_cannot_train_on_is_refused_by_name(
    fake_cuda: Any,
) -> None:
    """``mps`` trained on the CPU, silently; a GPU index the machine lacks is refused before
    a Trainer is built."""
    with pytest.raises(ValueError, match=r"trainer.accelerator='mps': fedlit trains on a CPU"):
        check_trainer(TrainerTemplate(accelerator="mps"))
    fake_cuda(count=2)
    with pytest.raises(ValueError, match=r"trainer.devices=\[3\]: this machine has 2 visible"):
        check_trainer(TrainerTemplate(devices=[3]))


# --- 5. Ray without GPUs for its actors on a GPU machine --------------------------------------
def test_ray_with_no_gpu_per_client_on_a_gpu_machine_is_refused_before_ray_starts(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray")
    from fedlit.federation.executors import RayPool, RaySettings

    def no_start(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Ray was started")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_start)
    fake_cuda()

    class Runner:
        trainer = TrainerTemplate()

    with pytest.raises(ValueError, match=r"federation.ray.gpus=0 on a machine with a CUDA GPU"):
        RayPool(Runner(), RaySettings(), 2)  # type: ignore[arg-type]


# --- 6. resume on fewer GPUs than the checkpoint saw ------------------------------------------
def test_a_resume_that_sees_fewer_gpus_restores_the_generators_it_has(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_cuda(count=1)
    restored: list[int] = []

    def set_state(state: torch.Tensor, device: int = 0) -> None:
        if device >= torch.cuda.device_count():  # as torch's own: no such generator
            raise IndexError(f"no CUDA generator {device}")
        restored.append(device)

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_state)
    states = rng_states()
    before = torch.get_rng_state()
    torch.rand(3)
    set_rng_states(states | {"cuda": [torch.zeros(16, dtype=torch.uint8)] * 2})
    assert restored == [0]
    assert torch.equal(torch.get_rng_state(), before)


# --- 7. compiled steps where they cannot build ------------------------------------------------
def test_compile_is_refused_where_triton_or_torch_cannot_build_it(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU below compute capability 7.0 (a P100) has Triton but no kernels from it; a torch
    without dynamo's ``trace_autograd_ops`` (before 2.11) crashed at the first compiled fit."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "triton" else find_spec(name, *a),
    )
    fake_cuda(capability=(6, 0))
    assert "compute capability 6.0" in (compile_toolchain_missing(torch.device("cuda")) or "")
    fake_cuda(capability=(8, 0))
    assert compile_toolchain_missing(torch.device("cuda")) is None
    monkeypatch.delitem(vars(torch._dynamo.config)["_config"], "trace_autograd_ops")
    assert not hasattr(torch._dynamo.config, "trace_autograd_ops")
    for device in ("cuda", "cpu"):
        assert "2.11" in (compile_toolchain_missing(torch.device(device)) or "")


# --- 8. fp16: the scaler kept, a skipped step not counted -------------------------------------
FP16 = loop.LoopSettings(torch.device("cpu"), "16-mixed")
SCHEDULE = WarmupCosine(warmup=0.5)


class Counted(SupervisedCE):
    """Counts its ``after_step`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_steps = 0

    def after_step(self) -> None:
        self.after_steps += 1


def _fp16_reference(
    network: torch.nn.Module, epochs: int, scale: float = 2.0**16
) -> tuple[torch.nn.Module, int, int]:
    """The fp16 loop's contract in plain torch: autocast in fp16, a GradScaler from ``scale``; a
    step whose gradients overflow is skipped by the scaler and counts as no step (no
    scheduler step). Returns the network, the steps taken and the steps skipped."""
    torch.manual_seed(3)
    draws = FitDraws()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9, foreach=True)
    planned = epochs * 5
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: SCHEDULE(min(step / planned, 1.0))
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    taken = skipped = 0
    for _ in range(epochs):
        for raw in _loader().on_device(torch.device("cpu")):
            x, y = raw.draw(draws).expand()
            with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
                loss = F.cross_entropy(network(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < scale:  # backed off: the step was skipped
                skipped += 1
                continue
            taken += 1
            scheduler.step()
    return network, taken, skipped


def _poisoned(at: frozenset[int] = frozenset({0, 3})) -> torch.nn.Module:
    """A network whose first weight's gradient is inf at the backward passes numbered ``at``
    (from 0): an overflow the scaler must skip, whatever the precision's rounding."""
    torch.manual_seed(0)
    network = Architecture(10, 1).build()
    passes = iter(range(10**6))

    def poison(grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, float("inf")) if next(passes) in at else grad

    next(network.parameters()).register_hook(poison)
    return network


def _fp16_fit(network: torch.nn.Module, epochs: int, compiled_fields: Any = None) -> Counted:
    objective = Counted(network, lr=0.1, momentum=0.9, schedule=SCHEDULE)
    torch.manual_seed(3)
    batches = _loader().on_device(torch.device("cpu"))  # as TrainerTemplate.fit sets it
    loop.fit(objective, batches, epochs, None, FP16, compiled_fields or {}, False, None)
    return objective


def test_an_eager_fp16_fit_trains_as_plain_torch_and_a_skipped_step_counts_as_none() -> None:
    """Bit for bit as the contract: the scaler skips the steps whose gradients overflow, and
    such a step advances no scheduler, no ``after_step`` and no step count."""
    network = _poisoned()
    reference, taken, skipped = _fp16_reference(_poisoned(), epochs=2)
    assert (taken, skipped) == (8, 2)
    objective = _fp16_fit(network, epochs=2)
    torch.testing.assert_close(
        objective.network.state_dict(), reference.state_dict(), rtol=0, atol=0
    )
    assert objective.steps_taken() == objective.after_steps == taken


def test_an_fp16_fit_whose_every_gradient_overflows_stops_with_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A skipped step counts as none, so a fit of steps that all overflow (a loss that is not
    finite) would never end: it stops after ``MAX_SKIPPED`` in a row, naming the precision."""
    monkeypatch.setattr(loop, "MAX_SKIPPED", 7)
    objective = Counted(_poisoned(frozenset(range(10**6))), lr=0.1)
    with pytest.raises(FloatingPointError, match="16-mixed: 7 steps in a row had inf or NaN"):
        loop.fit(objective, _loader().on_device(torch.device("cpu")), 1, 50, FP16, {}, False)
    assert objective.steps_taken() == objective.after_steps == 0


def test_a_compiled_fp16_fit_trains_as_plain_torch_within_rounding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled step (three calls: fp16 keeps the scaler apart) against the contract:
    the same steps skipped and taken, the weights to fp16 rounding."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    network = _poisoned()
    reference, taken, skipped = _fp16_reference(_poisoned(), epochs=1)
    assert (taken, skipped) == (3, 2)
    objective = Counted(network, lr=0.1, momentum=0.9, schedule=SCHEDULE)
    with whole_step_compiled(objective, "default") as fields:
        torch.manual_seed(3)
        loop.fit(objective, _loader().on_device(torch.device("cpu")), 1, None, FP16, fields)
    assert objective.steps_taken() == objective.after_steps == taken
    state, expected = objective.network.state_dict(), reference.state_dict()
    for key, value in expected.items():
        if value.is_floating_point():
            torch.testing.assert_close(state[key], value, rtol=2e-2, atol=2e-3)


def test_a_networks_fp16_scaler_is_kept_across_its_fits_and_in_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The server's network keeps its scaler from fit to fit (a new one at 2**16 skipped the
    first steps of every fit); a client's fit, on a worker's network (kept optimisers), starts
    a new one. The scale goes through the checkpoint: a resumed run scales on from it."""
    network = _poisoned()
    first = _fp16_fit(network, epochs=1)
    scale = loop.SCALERS[network].get_scale()
    assert scale < 2.0**16
    second = loop.Fit(Counted(network, lr=0.1), first.fit_state, FP16, one_call=False)
    assert second.scaler is loop.SCALERS[network] and second.scaler.get_scale() == scale
    state = copy.copy(first.fit_state)
    state.kept_optimizers = KeptOptimizers()
    client = loop.Fit(Counted(network, lr=0.1), state, FP16, one_call=False)
    assert client.scaler is not None and client.scaler.get_scale() == 2.0**16

    root = torch.nn.Module()
    root.network = network
    saved = loop.scaler_states(root)
    assert saved == {"network": loop.SCALERS[network].state_dict()}
    fields = dict(round=1, method_state={}, client_states={}, visits={}, history=[], rng={},
                  meta={}, hparams={})
    RunCheckpoint(**fields, scalers=saved).save(tmp_path / "last.ckpt")  # type: ignore[arg-type]
    resumed = torch.nn.Module()
    resumed.network = copy.deepcopy(network)
    loop.restore_scalers(resumed, RunCheckpoint.load(tmp_path / "last.ckpt").scalers)
    again = loop.Fit(Counted(resumed.network, lr=0.1), first.fit_state, FP16, one_call=False)
    assert again.scaler is not None and again.scaler.get_scale() == scale
    RunCheckpoint(**fields).save(tmp_path / "old.ckpt")  # type: ignore[arg-type]
    assert RunCheckpoint.load(tmp_path / "old.ckpt").scalers == {}


# --- 9. a comparison's parallel fits spread over the GPUs -------------------------------------
def test_a_comparisons_parallel_fits_each_see_their_own_gpu(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``jobs: 2`` on a two-GPU machine: the two fits running at once get GPU 0 and GPU 1
    (``CUDA_VISIBLE_DEVICES``), the next one the GPU left free; the parent's own list of
    visible GPUs is what is shared out."""
    from fedlit.comparison import devices
    from fedlit.comparison.runner import fit_in_subprocess

    fake_cuda(count=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.visible_gpus() == ["0", "1"]
    together = threading.Barrier(2, timeout=10)
    seen: list[str | None] = []

    class Children:
        def start(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> object:
            seen.append(env.get("CUDA_VISIBLE_DEVICES"))
            return object()

        def wait(self, proc: object) -> int:
            if len(seen) <= 2:
                together.wait()  # both fits run at once
            return 0

    fit = fit_in_subprocess(tmp_path / "logs", 1, Children())  # type: ignore[arg-type]
    runs = [
        threading.Thread(target=fit, args=([f"--trainer.default_root_dir={tmp_path / n}"],))
        for n in "ab"
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    fit([f"--trainer.default_root_dir={tmp_path / 'c'}"])
    assert sorted(seen[:2]) == ["0", "1"] and seen[2] == "0"  # type: ignore[type-var]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert devices.visible_gpus() == ["5", "7"]
    assert np.all(np.array([g in ("0", "1") for g in seen]))
