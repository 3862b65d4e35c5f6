"""What travels between server and clients: a payload of named parts.

A payload maps a part's name to a state dict or a single tensor, e.g. ``{"model": {...}}``,
``{"model": {...}, "teacher": {...}}`` or ``{"model": {...}, "thresholds": tensor}``. Every
method sends and uploads its network's shared weights as ``"model"``; the other parts are the
method's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from fedlit.aggregation.rules import state_bytes

StateDict = dict[str, Tensor]
Payload = dict[str, StateDict | Tensor]

#: The part every payload and upload carries: the shared weights of the method's network.
MODEL = "model"


def host_copy(module: nn.Module, keep: Callable[[str], bool] = lambda key: True) -> StateDict:
    """A detached copy of ``module``'s state (the keys ``keep`` accepts) on the host: one copy
    op a tensor (``to("cpu", copy=True)``), where ``state_dict()``, ``detach``, ``cpu`` and
    ``clone`` would dispatch up to four, and copy twice from a GPU."""
    with torch.no_grad():
        state = module.state_dict(keep_vars=True)
        return {k: v.to("cpu", copy=True) for k, v in state.items() if keep(k)}


def detached_copy(module: nn.Module, keep: Callable[[str], bool] = lambda key: True) -> StateDict:
    """A detached copy of ``module``'s state (the keys ``keep`` accepts) where it lies: a
    client's upload stays on the device it was computed on until it is aggregated there (an
    executor of other processes moves it when it sends it)."""
    with torch.no_grad():
        state = module.state_dict(keep_vars=True)
        return {k: v.detach().clone() for k, v in state.items() if keep(k)}


def state_part(payload: Mapping[str, StateDict | Tensor], name: str) -> StateDict:
    """Part ``name`` of ``payload``, a state dict (KeyError / TypeError otherwise)."""
    value = payload[name]
    if isinstance(value, Tensor):
        raise TypeError(f"payload part {name!r} is a tensor, not a state dict")
    return value


def tensor_part(payload: Mapping[str, StateDict | Tensor], name: str) -> Tensor:
    """Part ``name`` of ``payload``, a single tensor (KeyError / TypeError otherwise)."""
    value = payload[name]
    if not isinstance(value, Tensor):
        raise TypeError(f"payload part {name!r} is a state dict, not a tensor")
    return value


def flatten_payload(payload: Mapping[str, StateDict | Tensor]) -> StateDict:
    """One state dict of every tensor of ``payload``: ``"<part>.<key>"``, or ``"<part>"`` for a
    part that is a single tensor."""
    flat: StateDict = {}
    for part, value in payload.items():
        if isinstance(value, Tensor):
            flat[part] = value
        else:
            flat |= {f"{part}.{key}": tensor for key, tensor in value.items()}
    return flat


def payload_bytes(payload: Mapping[str, StateDict | Tensor]) -> dict[str, int]:
    """Bytes each part occupies on the wire, uncompressed (numel * element size)."""
    return {part: state_bytes(value) for part, value in payload.items()}
