"""Methods whose objectives' ``configure_optimizers`` return what fedlit's loop does not take
(lists of optimisers and schedulers, a bare ReduceLROnPlateau, a ``monitor``), for the tests
that the run refuses them by name before it writes anything. A module of its own so that the
CLI can name its classes (``--model.class_path=own_optimizers.Lists``)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fedlit.methods import FedAvgFixMatch, ServerSL
from fedlit.objectives import FixMatch, Objective, SupervisedCE


def _sgd(objective: Objective) -> torch.optim.SGD:
    return torch.optim.SGD(objective.parameters(), lr=0.1)


class ListsFixMatch(FixMatch):
    def configure_optimizers(self) -> Any:
        optimizer = _sgd(self)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]


class PlateauFixMatch(FixMatch):
    def configure_optimizers(self) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(_sgd(self))


class MonitorFixMatch(FixMatch):
    def configure_optimizers(self) -> Any:
        return {"optimizer": _sgd(self), "monitor": "loss"}


class Lists(FedAvgFixMatch):
    """Clients whose objective returns ``([optimizer], [scheduler])``."""

    objective_class = ListsFixMatch


class Plateau(FedAvgFixMatch):
    """Clients whose objective returns a bare ReduceLROnPlateau."""

    objective_class = PlateauFixMatch


class Monitor(FedAvgFixMatch):
    """Clients whose objective returns an optimiser and a ``monitor``."""

    objective_class = MonitorFixMatch


class PlateauCE(SupervisedCE):
    def configure_optimizers(self) -> Any:
        optimizer = _sgd(self)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": plateau}


class ServerPlateau(ServerSL):
    """A server whose objective schedules its learning rate by a ReduceLROnPlateau."""

    def server_objective(self) -> Objective:
        return PlateauCE(self.network, **self._server_kwargs())


class HookedFixMatch(FixMatch):
    """Overrides a LightningModule hook fedlit's loop does not call."""

    def on_before_zero_grad(self, optimizer: Any) -> None:
        pass


class ManualCE(SupervisedCE):
    """Optimises by hand (Lightning's manual optimisation)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False


class Hooked(FedAvgFixMatch):
    """Clients whose objective overrides ``on_before_zero_grad``."""

    objective_class = HookedFixMatch


class ServerManual(ServerSL):
    """A server whose objective optimises by hand."""

    def server_objective(self) -> Objective:
        return ManualCE(self.network, **self._server_kwargs())


class Untuned(ServerSL):
    """A method that declares no search space (a tuning of it is refused by name)."""

    search_space: ClassVar[dict[str, Any]] = {}
