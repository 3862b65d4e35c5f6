"""A whole training step as one compiled graph (``federation.compile``).

Eager PyTorch launches several hundred small kernels per step of a small network, so on a GPU
a federation's round is bound by the host, not the card. Compiled, a step is one graph: the
views of the batch (:meth:`~fedlit.data.loaders.DrawnBatch.expand`: crop, flip, RandAugment,
Cutout, normalisation), every forward pass, the loss and its masks (the objective's
:meth:`~fedlit.objectives.Objective.step`), traced with ``fullgraph=True`` (a graph break is an
error, not a silent fallback), and its backward, which AOTAutograd compiles with it. What stays
outside is what must: the random draws and the optimiser's step, which runs fused (one kernel
over all parameters). The draws are the fit's (:class:`~fedlit.data.fit_draws.FitDraws`): a
generator of its own, seeded by one draw from torch's global CPU generator, draws a chunk of
steps at once and moves it to the device in one transfer; each step takes its slice. They have
the distributions of eager's per-batch draws, not their values. ``reduce-overhead`` replays
the forward and the backward as CUDA graphs.

One compiled function serves each (objective class, network) pair of a process: a worker's
persistent networks (one per role) mean one compilation per worker and batch shape, never one
per client or round. A round's changing numbers (a loss weight, a client's pseudo-labels) are
tensors that the step reads from slots kept for the worker
(:meth:`~fedlit.objectives.Objective.step_input`), overwritten in place every fit: torch.compile
takes a module's tensors as static inputs, whose memory a CUDA graph records, so a new tensor
every fit would record the graphs anew (a recording costs tens of milliseconds, and each one
stays in the graph tree's memory).
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fedlit.data.fit_draws import FitDraws
from fedlit.data.loaders import expand_batches
from fedlit.objectives.base import Objective, Step

#: torch.compile's backend: inductor (kernels generated for the device). The tests trace with
#: "aot_eager" (the same graphs, forward and backward, run by eager kernels: no code
#: generation) where only the graphs' count and breaks are checked.
BACKEND = "inductor"

#: Each network's compiled steps by (objective class, mode, backend), kept while it lives.
_STEPS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[type, str, str], Callable[..., Step]]] = (
    weakref.WeakKeyDictionary()
)

#: Each network's step inputs (:meth:`~fedlit.objectives.Objective.step_input`) by objective
#: class: the same tensors, overwritten in place, for every fit of a worker.
_SLOTS: weakref.WeakKeyDictionary[nn.Module, dict[type, dict[str, torch.Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def _whole_step(objective: Objective, batch: Any) -> Step:
    """The views of ``batch`` (drawn, not yet computed) and the objective's step on them."""
    return objective.step(expand_batches(batch))


def compiled_step(objective: Objective, mode: str) -> Callable[[Objective, Any], Step]:
    """The compiled whole step for ``objective``'s class and network in ``mode``
    (torch.compile's), built on first use. Each is a function of its own (a copy of
    :func:`_whole_step`'s code), so torch keeps a separate cache of graphs for each, and one
    objective's graphs never count against another's recompilation limit."""
    steps = _STEPS.setdefault(objective.network, {})
    key = (type(objective), mode, BACKEND)
    if key not in steps:
        code = _whole_step.__code__.replace(co_name=f"step_{type(objective).__name__}")
        function = types.FunctionType(code, _whole_step.__globals__, code.co_name)
        how = {"mode": mode} if BACKEND == "inductor" else {"backend": BACKEND}
        steps[key] = torch.compile(function, fullgraph=True, **how)  # type: ignore[call-overload]
    compiled = steps[key]
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
def whole_step_compiled(module: nn.Module, mode: str | None) -> Iterator[None]:
    """While the block runs, ``module`` (an objective) trains with its whole step compiled in
    ``mode`` (its views computed in the step from the fit's own draws, its optimiser fused);
    nothing for ``mode`` None. A module that is no such objective has its ``network`` compiled
    instead (``nn.Module.compile``), eager again after the block."""
    if mode is None:
        yield
        return
    if not compiles_whole(module):
        with compiled_network(module, mode):
            yield
        return
    assert isinstance(module, Objective)
    module.compiled_step, module.views_in_step = compiled_step(module, mode), True
    module.fit_draws = FitDraws()  # the fit's views' draws, made a chunk of steps at once
    module.step_slots = _SLOTS.setdefault(module.network, {}).setdefault(type(module), {})
    try:
        yield
    finally:
        module.compiled_step, module.views_in_step, module.step_slots = None, False, None
        module.fit_draws = None


@contextmanager
def compiled_network(module: nn.Module, mode: str) -> Iterator[None]:
    """``module.network`` compiled with ``torch.compile(mode=mode)`` (in place, its
    parameters, buffers and state-dict keys unchanged) while the block runs, and eager again
    after it; nothing for a module without a ``network``."""
    network = getattr(module, "network", None)
    if not isinstance(network, nn.Module):
        yield
        return
    network.compile(mode=mode)
    try:
        yield
    finally:
        network._compiled_call_impl = None  # what nn.Module.compile set: back to eager
