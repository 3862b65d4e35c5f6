"""A whole training step as one compiled graph (``federation.compile``).

Eager PyTorch launches several hundred small kernels per step of a small network, so on a GPU
a federation's round is bound by the host, not the card. Compiled, a step is one graph: the
views of the batch (:meth:`~fedlit.data.loaders.DrawnBatch.expand`: crop, flip, RandAugment,
Cutout, normalisation), every forward pass, the loss and its masks (the objective's
:meth:`~fedlit.objectives.Objective.step`), traced with ``fullgraph=True`` (a graph break is an
error, not a silent fallback), and its backward. Where the fit's rule allows it
(:func:`fedlit.federation.fit.how_to_fit`) the optimiser's update is in the graph too, so a
step is one call (:class:`OneCallStep`); elsewhere the backward is AOTAutograd's and the
optimiser's step runs fused after it. ``reduce-overhead`` records the graphs as CUDA graphs.

What stays outside is what must: the random draws. They are the fit's
(:class:`~fedlit.data.augment.FitDraws`): a generator of its own, seeded by one draw from
torch's global CPU generator, draws a chunk of steps at once and moves it to the device in one
transfer; each step takes its slice. They have the distributions of eager's per-batch draws,
not their values.

One compiled function serves each (objective class, network) pair of a process: a worker's
persistent networks (one per role) mean one compilation per worker and batch shape, never one
per client or round. A round's changing numbers (a loss weight, a client's pseudo-labels) are
tensors that the step reads from slots kept for the worker
(:meth:`~fedlit.objectives.Objective.step_input`), overwritten in place every fit: a CUDA
graph records a static input's memory, so a new tensor every fit would record the graphs anew.
The learning rate a one-call step reads is such a slot too.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch._dynamo
import torch._inductor
from torch import Tensor, nn
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from fedlit.data.augment import FitDraws
from fedlit.data.loaders import expand_batches
from fedlit.objectives.base import Objective, Step

#: torch.compile's backend: inductor (kernels generated for the device). The tests trace with
#: "aot_eager" (the same graphs, forward and backward, run by eager kernels: no code
#: generation) where only the graphs' count and breaks are checked.
BACKEND = "inductor"

#: Each network's compiled steps by (objective class, function, mode, backend, C++ wrapper),
#: kept while it lives.
_STEPS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[type, str, str, str, bool], Any]] = (
    weakref.WeakKeyDictionary()
)

#: Each network's step inputs (:meth:`~fedlit.objectives.Objective.step_input`) by objective
#: class: the same tensors, overwritten in place, for every fit of a worker.
_SLOTS: weakref.WeakKeyDictionary[nn.Module, dict[type, dict[str, torch.Tensor]]] = (
    weakref.WeakKeyDictionary()
)

#: Each network's learning-rate tensor by objective class, read by its one-call step
#: (:class:`OneCallStep`): the same tensor, overwritten in place, for every fit of a worker.
_LRS: weakref.WeakKeyDictionary[nn.Module, dict[type, torch.Tensor]] = weakref.WeakKeyDictionary()


def _whole_step(objective: Objective, batch: Any) -> Step:
    """The views of ``batch`` (drawn, not yet computed) and the objective's step on them."""
    return objective.fit_step(expand_batches(batch))


def _compiled(
    function: Callable[..., Step], objective: Objective, mode: str, cpp_wrapper: bool = False
) -> Any:
    """``function`` compiled for ``objective``'s class and network in ``mode``
    (torch.compile's), built on first use; with ``cpp_wrapper``, inductor's code that calls
    the kernels is C++ too, not Python, and allocates the graph's buffers in one pool (less
    host work a call on a CPU). Each is a function
    of its own (a copy of ``function``'s code), so torch keeps a separate cache of graphs for
    each, and one objective's graphs never count against another's recompilation limit."""
    steps = _STEPS.setdefault(objective.network, {})
    key = (type(objective), function.__name__, mode, BACKEND, cpp_wrapper)
    if key not in steps:
        name = f"{function.__name__.strip('_')}_{type(objective).__name__}"
        code = function.__code__.replace(co_name=name)
        copy = types.FunctionType(code, function.__globals__, name)
        how: dict[str, Any] = {"backend": BACKEND}
        if BACKEND == "inductor":
            options = torch._inductor.list_mode_options(mode)
            if cpp_wrapper:  # and its buffers from one pooled allocation a call; on a CPU,
                # where there is no CUDA graph to record (inductor warns it is skipped)
                options.pop("triton.cudagraphs", None)
                options |= {"cpp_wrapper": True, "memory_planning": True}
            how = {"options": options}
        steps[key] = torch.compile(copy, fullgraph=True, **how)
    return steps[key]


def compiled_step(objective: Objective, mode: str) -> Callable[[Objective, Any], Step]:
    """The compiled whole step (:func:`_whole_step`) for ``objective``'s class and network in
    ``mode`` (torch.compile's)."""
    compiled = _compiled(_whole_step, objective, mode)
    if mode != "reduce-overhead":
        return compiled

    def replay(objective: Objective, batch: Any) -> Step:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs are read
        return compiled(objective, batch)

    return replay


def compiles_whole(module: nn.Module) -> bool:
    """Whether ``module`` trains by an objective's :meth:`~fedlit.objectives.Objective.step`,
    which the whole-step compilation takes."""
    return isinstance(module, Objective) and type(module).step is not Objective.step


@contextmanager
def whole_step_compiled(objective: Objective, mode: str) -> Iterator[dict[str, Any]]:
    """While the block runs, ``objective``'s fit takes its whole step compiled in ``mode``:
    the block gets the fit state's fields for it (:class:`~fedlit.objectives.FitState`: the
    compiled step, its mode, the worker's slots and the fit's own draws, made a chunk of
    steps at once)."""
    fields = {
        "compiled_step": compiled_step(objective, mode),
        "compiled_mode": mode,
        "draws": FitDraws(),
        "slots": _SLOTS.setdefault(objective.network, {}).setdefault(type(objective), {}),
    }
    # dynamo traces torch.autograd.grad into a graph (a one-call step's backward) while the
    # fit runs; by default it breaks the graph there
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        yield fields


# --- one call a step: the step, its backward and the optimiser's update in one graph ----------
def _sgd(
    params: list[Tensor], grads: list[Tensor], state: Any, lr: Tensor, hyper: tuple[Any, ...]
) -> None:
    """torch's functional SGD (what ``torch.optim.SGD`` runs) on the optimiser's buffers."""
    weight_decay, momentum, nesterov, maximize = hyper
    sgd(
        params,
        grads,
        state[0],
        foreach=True,
        weight_decay=weight_decay,
        momentum=momentum,
        lr=lr,
        dampening=0.0,
        nesterov=nesterov,
        maximize=maximize,
    )


def _adam(
    params: list[Tensor], grads: list[Tensor], state: Any, lr: Tensor, hyper: tuple[Any, ...]
) -> None:
    """torch's functional Adam (what ``torch.optim.Adam`` runs) on the optimiser's moments
    and step counts."""
    beta1, beta2, eps, weight_decay, maximize, decoupled = hyper
    exp_avgs, exp_avg_sqs, steps = state
    adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        foreach=True,
        capturable=True,  # the step counts and the learning rate are tensors of the graph
        decoupled_weight_decay=decoupled,
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=lr,
        weight_decay=weight_decay,
        eps=eps,
        maximize=maximize,
    )


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[Any, Any, tuple[Any, ...]] | None:
    """``optimizer``'s update as a step's graph takes it: (torch's functional update, the
    state tensors it updates in place, the settings it reads), or None where it is not one a
    graph holds here (another kind, several parameter groups, dampening, AMSGrad). The state
    a new optimiser does not have yet is made as its first step would make it (zeros), and
    stays in ``optimizer.state``."""
    groups = optimizer.param_groups
    if len(groups) != 1 or groups[0].get("differentiable") or groups[0].get("capturable"):
        return None
    group = groups[0]
    params = group["params"]
    if not params:
        return None
    if type(optimizer) is torch.optim.SGD and not group["dampening"]:
        hyper: tuple[Any, ...] = (
            group["weight_decay"],
            group["momentum"],
            group["nesterov"],
            group["maximize"],
        )
        if not group["momentum"]:
            return _sgd, ([None] * len(params),), hyper
        buffers = []
        for p in params:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        return _sgd, (buffers,), hyper
    if type(optimizer) is torch.optim.Adam and not group["amsgrad"]:
        beta1, beta2 = group["betas"]
        hyper = (beta1, beta2, group["eps"], group["weight_decay"], group["maximize"])
        hyper += (group.get("decoupled_weight_decay", False),)
        states = []
        for p in params:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if state["step"].device != p.device:
                return None  # a non-fused Adam's counts on the CPU: not in a device's graph
            states.append(state)
        state_lists = tuple([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "step"))
        return _adam, state_lists, hyper
    return None


def _whole_update(
    objective: Objective,
    params: list[Tensor],
    state: Any,
    lr: Tensor,
    batch: Any,
    update: Callable[..., None],
    hyper: tuple[Any, ...],
    autocast: tuple[str, torch.dtype] | None,
) -> Step:
    """One optimiser step: the views of ``batch`` and the objective's step (in ``autocast``
    where given), the gradients of its loss, and ``update`` of ``params`` with them, where
    a parameter the loss does not use keeps its weights and state (as an optimiser skips a
    parameter without a gradient). The loss and the logged tensors, detached."""
    with torch.enable_grad():
        if autocast is None:
            loss, logged = objective.fit_step(expand_batches(batch))
        else:
            with torch.autocast(autocast[0], dtype=autocast[1], cache_enabled=False):
                loss, logged = objective.fit_step(expand_batches(batch))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    used = [k for k, g in enumerate(grads) if g is not None]
    update(
        [params[k] for k in used],
        [grads[k] for k in used],
        tuple(None if s is None else [s[k] for k in used] for s in state),
        lr,
        hyper,
    )
    detached = tuple(
        (w, {k: v.detach() if isinstance(v, Tensor) else v for k, v in values.items()})
        for w, values in logged
    )
    return loss.detach(), detached


class OneCallStep:
    """A compiled fit's optimiser step as one call of one compiled graph: the views, the
    objective's step, its backward (``torch.autograd.grad``, traced into the graph) and the
    optimiser's update (torch's functional SGD or Adam, on the optimiser's own state
    tensors), where a compiled step alone is three calls (the step, autograd's backward,
    the optimiser's fused step) and a Python round trip between each. On a GPU under
    ``reduce-overhead``, torch records the graph as a CUDA graph and replays it each step.

    The learning rate is a tensor the graph reads, set from the optimiser's param group
    before each call (a scheduler changes it every step). The gradients are never stored in
    the parameters' ``.grad``."""

    def __init__(
        self,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        mode: str,
        autocast: tuple[str, torch.dtype] | None,
        how: tuple[Any, Any, tuple[Any, ...]],
    ) -> None:
        self.objective, self.optimizer, self.autocast = objective, optimizer, autocast
        self.update, self.state, self.hyper = how
        self.group = optimizer.param_groups[0]
        self.params: list[Tensor] = list(self.group["params"])
        device = self.params[0].device
        self.replay = mode == "reduce-overhead" and device.type != "cpu"
        # the learning rate: one tensor for every fit of the worker's objective class and
        # network, as the step's inputs (a CUDA graph records a static input's memory)
        lrs = _LRS.setdefault(objective.network, {})
        lr = lrs.get(type(objective))
        if lr is None or lr.device != device:
            lr = lrs[type(objective)] = torch.zeros((), device=device)
        self.lr: Tensor = lr
        self.lr.fill_(self.group["lr"])
        self.lr_value = self.group["lr"]
        # what the graph updates in place keeps its memory from call to call: a CUDA graph
        # replays into it (the parameters, the optimiser's state, the learning rate)
        state = [t for s in self.state for t in s if t is not None]
        for t in (self.lr, *self.params, *state):
            torch._dynamo.mark_static_address(t, guard=False)
        self.compiled = _compiled(_whole_update, objective, mode, device.type == "cpu")

    def __call__(self, batch: Any) -> Step:
        """One optimiser step on ``batch`` (drawn, its views not yet computed): its loss and
        logs."""
        lr = self.group["lr"]
        if lr != self.lr_value:
            self.lr.fill_(lr)
            self.lr_value = lr
        if self.replay:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():  # an inference graph: the gradients are the graph's own
            return self.compiled(
                self.objective,
                self.params,
                self.state,
                self.lr,
                batch,
                self.update,
                self.hyper,
                self.autocast,
            )


def one_call_step(
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    autocast: tuple[str, torch.dtype] | None,
) -> OneCallStep | None:
    """``objective``'s optimiser step as one compiled call (:class:`OneCallStep`) where its
    fit runs compiled (:func:`whole_step_compiled`) and its optimiser's update is one a graph
    holds (:func:`_optimizer_state`); else None (the rule that asks for it:
    :func:`fedlit.federation.fit.how_to_fit`)."""
    mode = objective.fit_state.compiled_mode
    how = _optimizer_state(optimizer)
    if objective.fit_state.compiled_step is None or mode is None or how is None:
        return None
    return OneCallStep(objective, optimizer, mode, autocast, how)
