"""Server momentum on the aggregated update (Hsu et al. 2019's FedAvgM; SemiFL's beta_g): the
change the aggregation would make, current - aggregate, is a pseudo-gradient that the server
steps along with SGD, learning rate 1 and momentum beta."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from fedlit.aggregation.rules import State


def momentum_step(
    current: State, aggregate: State, velocity: Mapping[str, Tensor], beta: float
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One server step: for every key of ``velocity``, v' = beta v + (current - aggregate) and
    w' = current - v'; every other key of ``aggregate`` as it is (BatchNorm's buffers).

    With v = 0 (the first round) w' is the aggregate; beta = 0 is plain averaging. Pure: the
    inputs are not changed.

    Returns:
        (the new state, the new velocity).
    """
    if not 0.0 <= beta < 1.0:  # False for NaN too
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    missing = [k for k in velocity if k not in current or k not in aggregate]
    if missing:
        raise ValueError(f"key {missing[0]!r} of the velocity is not in both states")
    new_velocity = {
        k: beta * v + (current[k].to(v.dtype) - aggregate[k].to(v.dtype))
        for k, v in velocity.items()
    }
    state = dict(aggregate)
    for k, v in new_velocity.items():
        state[k] = (current[k].to(v.dtype) - v).to(aggregate[k].dtype)
    return state, new_velocity


class ServerMomentum(nn.Module):
    """The velocity of :func:`momentum_step` for ``keys`` (a network's parameters), kept as
    buffers: in the method's state dict, so a checkpoint holds it and a resumed run steps on
    from it exactly.

    Args:
        shapes: each key's shape (its parameter's).
        beta: the momentum (SemiFL: beta_g = 0.5).
    """

    def __init__(self, shapes: Iterable[tuple[str, torch.Size]], beta: float) -> None:
        super().__init__()
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"global_momentum must be in [0, 1), got {beta}")
        self.beta = beta
        pairs = list(shapes)
        self.keys = [key for key, _ in pairs]
        for key, shape in pairs:
            self.register_buffer(self._name(key), torch.zeros(shape))

    @staticmethod
    def _name(key: str) -> str:
        return "v__" + key.replace(".", "__")

    def velocity(self) -> dict[str, Tensor]:
        return {key: getattr(self, self._name(key)) for key in self.keys}

    @torch.no_grad()
    def forward(self, current: State, aggregate: State) -> dict[str, Tensor]:
        """The state after the server's step from ``current`` towards ``aggregate``; the
        velocity is updated in place."""
        velocity = self.velocity()
        state, new = momentum_step(current, aggregate, velocity, self.beta)
        for key, value in new.items():
            velocity[key].copy_(value)
        return state
