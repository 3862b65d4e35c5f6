"""A compiled fit's optimiser step as one call (:class:`~fedlit.federation.fit.compiled.OneCallStep`:
the step, its backward and the optimiser's update in one graph) trains as the three calls it
replaces (the compiled step, autograd's backward, the optimiser's step), to float32 rounding;
where something must run between those calls, the fit keeps them apart.

The graphs run on the ``aot_eager`` backend (traced as inductor's are, run by eager kernels)
to keep the suite fast; one case runs inductor's kernels.

How close "to float32 rounding" is, is measured, not typed in: the same fit run in float64 is
the reference, and the one-call fit must be as close to it as the three calls are. The network
is smooth (SiLU, average pooling, no bias that a BatchNorm cancels): with ReLU and max pooling
a training is only piecewise smooth, and two float32 fits whose weights differ by a rounding
cross a kink (a unit's sign, a pooling window's maximum) in some runs and not in others,
depending on the CPU's kernels and thread count (measured: 6e-8 after 2 steps, 1.4e-5 at the
third, 3e-3 after 10, on 2 threads of an AVX-512 CPU and not on 1)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch
from test_fit_loop import _loader

from fedlit.federation.checks import check_trainer
from fedlit.federation.fit import TrainerTemplate, compiled, how_to_fit, loop
from fedlit.federation.fit.compiled import _optimizer_state, one_call_step, whole_step_compiled
from fedlit.models import Architecture
from fedlit.objectives import FitState, SupervisedCE
from fedlit.objectives.schedules import WarmupCosine

CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "sgd": ({}, {"momentum": 0.9, "weight_decay": 5e-4}),
    "sgd, a schedule": ({}, {"momentum": 0.9, "schedule": WarmupCosine(warmup=0.2)}),
    "sgd without momentum": ({}, {"momentum": 0.0, "weight_decay": 5e-4}),
    "adam": ({}, {"optimizer": "adam", "weight_decay": 1e-4}),
    "bf16 mixed": ({"precision": "bf16-mixed"}, {"momentum": 0.9}),
}


class SmoothNet(torch.nn.Module):
    """Images (N, 1, 28, 28) -> logits (N, 10): two convolutions with BatchNorm, SiLU and
    average pooling, then a linear layer; smooth in its weights. The images are cast to the
    weights' dtype (a float64 copy is the reference)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(16),
            torch.nn.SiLU(),
            torch.nn.AvgPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(32),
            torch.nn.SiLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.to(self.body[0].weight.dtype))


def _fit(
    network: torch.nn.Module, template: TrainerTemplate, objective_kw: dict[str, Any]
) -> SupervisedCE:
    objective = SupervisedCE(copy.deepcopy(network), lr=0.05, **objective_kw)
    torch.manual_seed(3)
    template.fit(objective, _loader(), epochs=2)
    return objective


@pytest.mark.parametrize(
    ("case", "backend"), [*((c, "aot_eager") for c in CASES), ("sgd, a schedule", "inductor")]
)
def test_one_call_trains_as_the_three_calls_it_replaces(
    case: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two epochs of a compiled lean fit, each step one call, against the same fit with the
    step, the backward and the optimiser's step called apart: the same weights and logs to
    float32 rounding; the one-call fit never stores a gradient (the three calls do); a layer
    the loss does not use keeps its weights, as an optimiser skips a parameter without a
    gradient."""
    monkeypatch.setattr(compiled, "BACKEND", backend)
    settings, objective_kw = CASES[case]
    template = TrainerTemplate(
        accelerator="cpu", compile="default", **{"precision": "32-true", **settings}
    )
    torch.manual_seed(0)
    network = SmoothNet()
    network.unused = torch.nn.Linear(3, 3)  # a layer the loss never uses
    calls = []
    build = loop.one_call_step

    def counted(*args: Any) -> Any:
        step = build(*args)
        calls.append(step)
        return step

    monkeypatch.setattr(loop, "one_call_step", counted)
    one = _fit(network, template, objective_kw)
    assert calls and all(c is not None for c in calls)
    monkeypatch.setattr(loop, "one_call_step", lambda *args: None)
    three = _fit(network, template, objective_kw)
    reference = _fit(copy.deepcopy(network).double(), template, objective_kw)  # float64

    assert all(p.grad is None for p in one.parameters())
    assert any(p.grad is not None for p in three.parameters())
    states = [f.network.state_dict() for f in (one, three, reference)]
    floats = [k for k, v in states[2].items() if v.is_floating_point()]
    # the three calls' own rounding error (float32, or bf16 mixed), measured against float64
    error = max((states[1][k].double() - states[2][k]).abs().max().item() for k in floats)
    for name in floats:
        if name.startswith("unused"):
            torch.testing.assert_close(states[0][name], states[1][name], rtol=0, atol=0)
            torch.testing.assert_close(
                states[0][name], network.unused.state_dict()[name[7:]], rtol=0, atol=0
            )
            continue
        # the one-call fit is as close to float64 as the three calls (4x: the greatest of
        # thousands of rounding errors varies from one fit to another)
        torch.testing.assert_close(
            states[0][name].double(), states[2][name], rtol=0, atol=4 * error
        )
    moved = max(
        (a.float() - b.float()).abs().max().item()
        for (k, a), b in zip(
            network.state_dict().items(), one.network.state_dict().values(), strict=True
        )
        if not k.startswith("num_batches")
    )
    assert moved > 1e3 * error  # it trained, far beyond the rounding
    metrics = [f.epoch_metrics() for f in (one, three, reference)]
    assert metrics[0].keys() == metrics[1].keys()
    for name, value in metrics[0].items():
        # a metric moves with the weights (their error) and rounds in its own sums
        bound = 4 * max(abs(metrics[1][name] - metrics[2][name]), error)
        assert value == pytest.approx(metrics[2][name], rel=0, abs=bound), name


def test_the_calls_stay_apart_where_something_runs_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule (:func:`~fedlit.federation.fit.how_to_fit`): eager without
    ``federation.compile``; compiled, one call, except where something runs between the calls
    (clipping reads the gradients, anomaly detection, an fp16 gradient scaler) or
    ``FEDLIT_ONE_CALL=0``; an optimiser whose update a graph does not hold here (AMSGrad,
    SGD's dampening, two parameter groups) takes the three calls too."""
    torch.manual_seed(0)
    network = Architecture(10, 1).build()
    objective = SupervisedCE(network, lr=0.1)
    eager = TrainerTemplate(accelerator="cpu", precision="32-true")
    template = replace(eager, compile="default")
    assert how_to_fit(objective, eager) == "eager"
    assert how_to_fit(objective, template) == "one call"
    assert how_to_fit(objective, replace(template, gradient_clip_val=1.0)) == "compiled"
    assert how_to_fit(objective, replace(template, detect_anomaly=True)) == "compiled"
    assert how_to_fit(objective, replace(template, precision="bf16-mixed")) == "one call"
    monkeypatch.setenv("FEDLIT_ONE_CALL", "0")
    assert how_to_fit(objective, template) == "compiled"
    monkeypatch.setenv("FEDLIT_ONE_CALL", "1")
    assert how_to_fit(objective, template) == "one call"
    params = list(network.parameters())
    for optimizer in (
        torch.optim.Adam(params, amsgrad=True),
        torch.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.1),
        torch.optim.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1),
        torch.optim.RMSprop(params),
    ):
        assert _optimizer_state(optimizer) is None
    with whole_step_compiled(objective, "default") as fields:
        fp16 = loop.LoopSettings(torch.device("cpu"), "16-mixed")
        run = loop.Fit(objective, FitState(4, **fields), fp16, one_call=True)
        assert run.scaler is not None and run.one_call is None
        bf16 = loop.LoopSettings(torch.device("cpu"), "bf16-mixed")
        run = loop.Fit(objective, FitState(4, **fields), bf16, one_call=True)
        assert run.scaler is None and run.one_call is not None
        assert one_call_step(objective, torch.optim.Adam(params, amsgrad=True), None) is None


@pytest.mark.parametrize("value", ["no", "garbage", "2", "true"])
def test_a_one_call_setting_other_than_0_or_1_is_refused_by_name(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FEDLIT_ONE_CALL`` other than 0 or 1 (``no`` once gave one call silently) is refused,
    naming it, by the run's check of its settings before any work."""
    monkeypatch.setenv("FEDLIT_ONE_CALL", value)
    with pytest.raises(ValueError, match=f"FEDLIT_ONE_CALL='{value}'"):
        check_trainer(TrainerTemplate(accelerator="cpu"))
    objective = SupervisedCE(Architecture(10, 1).build(), lr=0.1)
    with pytest.raises(ValueError, match="FEDLIT_ONE_CALL"):
        how_to_fit(objective, TrainerTemplate(accelerator="cpu", compile="default"))


def test_a_new_optimisers_state_is_made_as_its_first_step_makes_it() -> None:
    """The state a one-call step updates is the optimiser's own: SGD's momentum buffers and
    Adam's moments and step counts, zeros where a new optimiser has none yet (its first
    step's result is the same), kept in ``optimizer.state``."""
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    how = _optimizer_state(sgd)
    assert how is not None
    buffers = how[1][0]
    assert all(b is sgd.state[p]["momentum_buffer"] for b, p in zip(buffers, params, strict=True))
    assert all(not b.any() and b.shape == p.shape for b, p in zip(buffers, params, strict=True))
    kept = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    kept.state[params[0]]["momentum_buffer"] = None  # a buffer not made yet
    how = _optimizer_state(kept)
    assert how is not None and how[1][0][0] is kept.state[params[0]]["momentum_buffer"]
    assert how[1][0][0].shape == params[0].shape and not how[1][0][0].any()
    adam = torch.optim.Adam(params, lr=0.1, fused=True)
    how = _optimizer_state(adam)
    assert how is not None
    exp_avgs, exp_avg_sqs, maxima, steps = how[1]
    assert maxima == []  # no AMSGrad
    assert all(s.item() == 0 and s.dtype == torch.float32 for s in steps)
    assert exp_avgs[0] is adam.state[params[0]]["exp_avg"]
    assert exp_avg_sqs[1] is adam.state[params[1]]["exp_avg_sq"]
