"""A whole training step as one compiled graph (``federation.compile``; why and what it
costs: docs/executors.md, *Compiled steps*), ``fullgraph=True`` (a graph break is an error):
the views of the batch (:meth:`~fedlit.data.loaders.DrawnBatch.expand`), the objective's
:meth:`~fedlit.objectives.Objective.step` and its backward; where
:func:`fedlit.federation.fit.how_to_fit` allows it, the optimiser's update too
(:class:`OneCallStep`). ``reduce-overhead`` records the graphs as CUDA graphs.

The random draws stay outside: the fit's own (:class:`~fedlit.data.augment.FitDraws`), a chunk
of steps at once, the same as an eager fit's. One compiled function serves
each (objective class, network) pair of a process: a worker's persistent networks compile once
per batch shape. A round's changing numbers (a loss weight, pseudo-labels, the learning rate)
are tensors kept for the worker and overwritten in place every fit
(:meth:`~fedlit.objectives.Objective.step_input`): a CUDA graph records a static input's memory.
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

from fedlit.data.loaders import expand_batches
from fedlit.objectives.base import Objective, Step

#: torch.compile's backend: inductor. The tests trace with "aot_eager" (the same graphs, run by
#: eager kernels) where only the graphs' count and breaks are checked.
BACKEND = "inductor"

#: What each network keeps while it lives, by key: its compiled steps, ("step", objective class,
#: function, mode, backend, C++ wrapper); its step inputs, ("slots", objective class); the
#: learning rate its one-call step reads, ("lr", objective class).
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


def _whole_step(objective: Objective, batch: Any) -> Step:
    """The views of ``batch`` (drawn, not yet computed) and the objective's step on them."""
    return objective.fit_step(expand_batches(batch))


def _compiled(
    function: Callable[..., Step], objective: Objective, mode: str, cpp_wrapper: bool = False
) -> Any:
    """``function`` compiled for ``objective``'s class and network in ``mode``, built on first
    use; ``cpp_wrapper``: inductor's calling code in C++ with one pooled allocation a call (less
    host work on a CPU). A copy of ``function``'s code each, so that torch keeps its graphs
    apart and one objective's never count against another's recompilation limit."""
    kept = _KEPT.setdefault(objective.network, {})
    key = ("step", type(objective), function.__name__, mode, BACKEND, cpp_wrapper)
    if key not in kept:
        name = f"{function.__name__.strip('_')}_{type(objective).__name__}"
        code = function.__code__.replace(co_name=name)
        copy = types.FunctionType(code, function.__globals__, name)
        how: dict[str, Any] = {"backend": BACKEND}
        if BACKEND == "inductor":
            options = torch._inductor.list_mode_options(mode)
            if cpp_wrapper:  # on a CPU: no CUDA graph to record (inductor warns it skips it)
                options.pop("triton.cudagraphs", None)
                options |= {"cpp_wrapper": True, "memory_planning": True}
            how = {"options": options}
        kept[key] = torch.compile(copy, fullgraph=True, **how)
    return kept[key]


def compiled_step(objective: Objective, mode: str) -> Callable[[Objective, Any], Step]:
    """:func:`_whole_step` compiled for ``objective``'s class and network in ``mode``."""
    compiled = _compiled(_whole_step, objective, mode)
    if mode != "reduce-overhead":
        return compiled

    def replay(objective: Objective, batch: Any) -> Step:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs are read
        return compiled(objective, batch)

    return replay


@contextmanager
def whole_step_compiled(objective: Objective, mode: str) -> Iterator[dict[str, Any]]:
    """While the block runs, ``objective``'s fit takes its whole step compiled in ``mode``; the
    block gets the :class:`~fedlit.objectives.FitState` fields for it."""
    fields = {
        "compiled_step": compiled_step(objective, mode),
        "compiled_mode": mode,
        "slots": _KEPT.setdefault(objective.network, {}).setdefault(("slots", type(objective)), {}),
    }
    # a one-call step's backward, torch.autograd.grad, traced into its graph (no break there)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        yield fields


# --- one call a step: the step, its backward and the optimiser's update in one graph ----------
def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[Any, Any, dict[str, Any]] | None:
    """``optimizer``'s update as a step's graph takes it: (torch's functional update, what
    ``torch.optim.SGD`` or ``Adam`` runs; the state tensors it updates in place, as its
    arguments after the gradients; its settings), or None where a graph does not hold it
    here (another kind, several parameter groups, dampening, AMSGrad). State a new optimiser
    lacks is made as its first step would make it (zeros), in ``optimizer.state``."""
    groups = optimizer.param_groups
    group = groups[0]
    if len(groups) != 1 or group.get("differentiable") or group.get("capturable"):
        return None
    params = group["params"]
    hyper = {k: group[k] for k in ("weight_decay", "maximize")} | {"foreach": True}
    if params and type(optimizer) is torch.optim.SGD and not group["dampening"]:
        hyper |= {k: group[k] for k in ("momentum", "nesterov")} | {"dampening": 0.0}
        if not group["momentum"]:
            return sgd, ([None] * len(params),), hyper
        for p in params:
            if optimizer.state[p].get("momentum_buffer") is None:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return sgd, ([optimizer.state[p]["momentum_buffer"] for p in params],), hyper
    if params and type(optimizer) is torch.optim.Adam and not group["amsgrad"]:
        beta1, beta2 = group["betas"]
        hyper |= {"beta1": beta1, "beta2": beta2, "eps": group["eps"], "amsgrad": False}
        decoupled = group.get("decoupled_weight_decay", False)
        hyper |= {"capturable": True, "decoupled_weight_decay": decoupled}
        for p in params:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if state["step"].device != p.device:
                return None  # a non-fused Adam's counts on the CPU: not in a device's graph
        # the moments, no AMSGrad maxima, the step counts (tensors of the graph: capturable)
        keys = ("exp_avg", "exp_avg_sq", "step")
        exp_avg, exp_avg_sq, step = ([optimizer.state[p][k] for p in params] for k in keys)
        return adam, (exp_avg, exp_avg_sq, [], step), hyper
    return None


def _whole_update(
    objective: Objective,
    params: list[Tensor],
    state: Any,
    lr: Tensor,
    update: Callable[..., None],
    hyper: dict[str, Any],
    autocast: tuple[str, torch.dtype] | None,
    batch: Any,
) -> Step:
    """One optimiser step: the objective's step on the views of ``batch`` (in ``autocast``
    where given), its gradients, and ``update`` of the parameters that have one (as an
    optimiser skips a parameter without a gradient). The loss and logs, detached."""
    with torch.enable_grad():
        if autocast is None:
            loss, logged = objective.fit_step(expand_batches(batch))
        else:
            with torch.autocast(autocast[0], dtype=autocast[1], cache_enabled=False):
                loss, logged = objective.fit_step(expand_batches(batch))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    used = [k for k, g in enumerate(grads) if g is not None]
    kept = tuple([s[k] for k in used] if s else s for s in state)
    update([params[k] for k in used], [grads[k] for k in used], *kept, lr=lr, **hyper)
    detached = tuple(
        (w, {k: v.detach() if isinstance(v, Tensor) else v for k, v in values.items()})
        for w, values in logged
    )
    return loss.detach(), detached


class OneCallStep:
    """A compiled fit's optimiser step as one call of one graph: the views, the objective's
    step, its backward (``torch.autograd.grad``, traced) and the optimiser's update (torch's
    functional SGD or Adam on the optimiser's own state), where a compiled step alone is three
    calls. Under ``reduce-overhead`` on a GPU, the graph is a CUDA graph, replayed each step.
    The learning rate is a tensor the graph reads, set from the optimiser before each call;
    the gradients never reach the parameters' ``.grad``."""

    def __init__(
        self,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        mode: str,
        autocast: tuple[str, torch.dtype] | None,
        how: tuple[Any, Any, dict[str, Any]],
    ) -> None:
        update, state, hyper = how
        self.group = optimizer.param_groups[0]
        params: list[Tensor] = list(self.group["params"])
        device = params[0].device
        self.replay = mode == "reduce-overhead" and device.type != "cpu"
        kept = _KEPT.setdefault(objective.network, {})
        lr = kept.get(("lr", type(objective)))
        if lr is None or lr.device != device:
            lr = kept[("lr", type(objective))] = torch.zeros((), device=device)
        self.lr, self.lr_value = lr, self.group["lr"]
        lr.fill_(self.lr_value)
        # what the graph updates in place keeps its memory from call to call (a CUDA graph
        # replays into it)
        for t in (lr, *params, *(t for s in state for t in s if t is not None)):
            torch._dynamo.mark_static_address(t, guard=False)
        self.inputs = (objective, params, state, lr, update, hyper, autocast)
        self.compiled = _compiled(_whole_update, objective, mode, device.type == "cpu")

    def __call__(self, batch: Any) -> Step:
        """One optimiser step on ``batch`` (drawn, its views not computed): its loss and logs."""
        if self.group["lr"] != self.lr_value:
            self.lr_value = self.group["lr"]
            self.lr.fill_(self.lr_value)
        if self.replay:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():  # an inference graph: the gradients are the graph's own
            return self.compiled(*self.inputs, batch)


def one_call_step(
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    autocast: tuple[str, torch.dtype] | None,
) -> OneCallStep | None:
    """``objective``'s optimiser step as one compiled call (:class:`OneCallStep`) where its
    fit runs compiled and a graph holds its optimiser's update; else None."""
    mode = objective.fit_state.compiled_mode
    how = _optimizer_state(optimizer)
    if objective.fit_state.compiled_step is None or mode is None or how is None:
        return None
    return OneCallStep(objective, optimizer, mode, autocast, how)
