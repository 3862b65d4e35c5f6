"""Training steps never wait for the device, the strong view's op count does not depend on its
draws, and the default precision follows the CPU's bf16 support (benchmarks/step_profile.py's
counter on tiny steps)."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import load_script

from fedlit.data.augment import BatchView
from fedlit.data.datasets import dataset_spec
from fedlit.federation.fit import TrainerTemplate, default_precision
from fedlit.machine import CPU_BF16_ENV, cpu_computes_bf16
from fedlit.objectives.fedmatch import agreement_pseudo_labels
from fedlit.objectives.fedseal import complementary_loss
from fedlit.objectives.teacher_student import kl_to_uniform

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "step_profile.py"


@pytest.fixture(scope="module")
def profile() -> ModuleType:
    return load_script(SCRIPT)


def test_the_counter_counts_reads_and_value_dependent_shapes(profile: ModuleType) -> None:
    counter = profile.Profile(count=True)
    t = torch.arange(6.0)
    with counter:
        float(t.sum())  # a read
        _ = t[t > 2]  # a shape that depends on the values
        _ = torch.where(t > 2, t, 0.0)  # neither
    assert counter.phases["other"].syncs == 2


@pytest.mark.parametrize("method", ["fixmatch", "fedseal", "server_sl"])
def test_no_host_sync_inside_client_and_server_steps(profile: ModuleType, method: str) -> None:
    setting = profile.Setting(method, "small_cnn", clients=2, examples=16, batch=8, rounds=1,
                              server_epochs=1)  # fmt: skip
    phases = profile.profiled(profile.run_fedlit, setting, count=True).phases
    server = phases["server step"]
    assert server.units > 0 and server.ops > 0
    assert server.syncs == 0, dict(server.sync_ops)
    if method != "server_sl":
        client = phases["client step"]
        assert client.units == 2 * 2  # 2 clients x 16 images / batch 8
        assert client.syncs == 0, dict(client.sync_ops)
        assert client.shapes == {(16, 1, 28, 28)}  # two views of 8 images, one forward


def test_strong_view_dispatches_the_same_ops_whatever_it_draws(profile: ModuleType) -> None:
    for name, shape in (("synthetic", (1, 28, 28)), ("synthetic_rgb", (3, 32, 32))):
        view = BatchView("strong", dataset_spec(name))
        images = torch.randint(0, 256, (24, *shape), dtype=torch.uint8)
        view(images)  # builds the per-size tables once
        counts = set()
        for seed in range(4):
            torch.manual_seed(seed)
            counter = profile.Profile(count=True)
            with counter:
                view(images)
            assert counter.phases["other"].syncs == 0
            counts.add(counter.phases["other"].ops)
        assert len(counts) == 1, counts


def test_sync_free_helpers_give_the_hand_computed_values() -> None:
    # votes: model says 2, helpers say 1 and 1 -> 1; a three-way tie -> the lowest class
    logits = torch.tensor([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    helpers = [torch.tensor([[0.0, 5.0, 0.0], [0.0, 5.0, 0.0]])] * 2
    assert agreement_pseudo_labels(logits, helpers).tolist() == [1, 1]
    three = [torch.tensor([[0.0, 5.0, 0.0]]), torch.tensor([[5.0, 0.0, 0.0]])]
    assert agreement_pseudo_labels(torch.tensor([[0.0, 0.0, 5.0]]), three).tolist() == [0]
    # half the predictions in one class of 4, half in another: log(4) - log(2)
    kl = kl_to_uniform(torch.tensor([0, 0, 3, 3]), 4)
    assert kl.item() == pytest.approx(math.log(2))


def test_complementary_loss_has_finite_gradients_where_p_is_one() -> None:
    """-log(1 - p) where p < 1/2, the stable other branch elsewhere; no NaN from the branch
    not chosen, also where an example is masked out of the mean (p = 1 in float32)."""
    logits = torch.tensor([[0.0, 0.0], [200.0, 0.0]], requires_grad=True)
    loss = complementary_loss(logits, torch.tensor([0, 0]))
    assert loss[0].item() == pytest.approx(math.log(2))
    (loss * torch.tensor([1.0, 0.0])).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_default_precision_is_bf16_where_the_cpu_computes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert default_precision("cpu", cpu_bf16=True) == "bf16-mixed"
    assert default_precision("cpu", cpu_bf16=False) == "32-true"
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert cpu_computes_bf16()
    assert TrainerTemplate(accelerator="cpu").resolved().precision == "bf16-mixed"
    explicit = TrainerTemplate(accelerator="cpu", precision="32-true")
    assert explicit.resolved().precision == "32-true"  # an explicit setting wins
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert TrainerTemplate(accelerator="cpu").resolved().precision == "32-true"


def test_cpu_bf16_is_asked_of_torch_without_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    for avx512_bf16, amx in ((True, False), (False, True), (False, False)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert cpu_computes_bf16() == (avx512_bf16 or amx)


def test_the_cpu_capability_checks_fedlit_reads_are_torchs() -> None:
    """``cpu_computes_bf16`` reads two private checks of ``torch.cpu`` (with a False default):
    a torch that renames them would silently train every CPU in fp32. Pinned here, for the
    torch range setup.cfg allows."""
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        assert callable(getattr(torch.cpu, name, None)), f"torch.cpu.{name} is gone"
        assert isinstance(getattr(torch.cpu, name)(), bool)
