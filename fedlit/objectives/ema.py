"""Target networks: frozen copies and the EMA steps that move them.

The EMA of parameters is lightly's ``update_momentum`` (xi <- m xi + (1 - m) theta); what a
target does with its buffers (BatchNorm statistics) is the method's choice: the teacher-student
clients copy the student's (:func:`copy_buffers`), the SSL and FedCon targets keep their own.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from lightly.models.utils import deactivate_requires_grad
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def frozen_copy(module: ModuleT) -> ModuleT:
    """A deep copy of ``module`` with every parameter's gradient switched off (a target net)."""
    clone = copy.deepcopy(module)
    deactivate_requires_grad(clone)
    return clone


def copy_buffers(source: nn.Module, target: nn.Module) -> None:
    """Copy ``source``'s buffers (BatchNorm statistics) into ``target`` in place."""
    for t, s in zip(target.buffers(), source.buffers(), strict=True):
        t.copy_(s)
