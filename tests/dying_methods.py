"""Methods whose worker process dies once or on every attempt, raises, signals the driver or
takes a minute, for the Ray and pool executors' tests. A module of its own so that the worker
processes can import it (the tests put this folder on PYTHONPATH or sys.path)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from fedlit.data import ClientData
from fedlit.methods import FedAvgFixMatch
from fedlit.methods.base import Payload
from fedlit.methods.client_side import ClientSide, ObjectiveClientSide
from fedlit.objectives import FixMatch, Objective

#: The file whose absence makes a worker die (its creation marks that one died).
MARKER = "FEDLIT_TEST_DIE_ONCE"

#: The client whose worker :class:`KillsItsWorker` kills on every attempt (unset: none).
KILLER = "FEDLIT_TEST_KILLER"

#: The folder where :class:`Slow`'s clients mark their start (a file per client).
STARTED = "FEDLIT_TEST_STARTED"


class FixMatchClient(ObjectiveClientSide):
    """FedAvg-FixMatch's client side, for the test clients below to override."""

    def __init__(self, method: FedAvgFixMatch) -> None:
        setup = method._client_setup()
        super().__init__(setup, ("weak", "strong"), FixMatch, loss=method.loss)


class DiesOnceClient(FixMatchClient):
    """A client whose worker process is killed (SIGKILL) while client 1 starts its round-1
    work, the first time only."""

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        marker = Path(os.environ[MARKER])
        if self.round_idx == 1 and client.client_id == 1 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().objective(payload, client, state)


class DiesOnce(FedAvgFixMatch):
    """FedAvg-FixMatch with :class:`DiesOnceClient`."""

    def client_side(self) -> ClientSide:
        return DiesOnceClient(self)


class UnreliableClient(DiesOnceClient):
    """DiesOnceClient whose client 3 also raises in round 2: a fault, not a dead worker."""

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        if self.round_idx == 2 and client.client_id == 3:
            raise ValueError("injected client failure")
        return super().objective(payload, client, state)


class Unreliable(FedAvgFixMatch):
    """FedAvg-FixMatch with :class:`UnreliableClient`."""

    def client_side(self) -> ClientSide:
        return UnreliableClient(self)


class SignalsDriverClient(FixMatchClient):
    """A client whose round-2 work takes a minute, the first of them after sending SIGTERM
    to the driver (its parent process) once: the run stops only if the driver stops its
    workers."""

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        if self.round_idx == 2:
            try:  # created by one client only, whichever is first
                os.close(os.open(os.environ[MARKER], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                os.kill(os.getppid(), signal.SIGTERM)
            except FileExistsError:
                pass
            time.sleep(60)
        return super().objective(payload, client, state)


class SignalsDriver(FedAvgFixMatch):
    """FedAvg-FixMatch with :class:`SignalsDriverClient`."""

    def client_side(self) -> ClientSide:
        return SignalsDriverClient(self)


class KillsItsWorkerClient(FixMatchClient):
    """A client whose work kills its own process (SIGKILL) on every attempt if it is the
    client the environment's :data:`KILLER` names: a pool worker taken down by its client."""

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        if str(client.client_id) == os.environ.get(KILLER):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().objective(payload, client, state)


class KillsItsWorker(FedAvgFixMatch):
    """FedAvg-FixMatch with :class:`KillsItsWorkerClient`."""

    def client_side(self) -> ClientSide:
        return KillsItsWorkerClient(self)


class SlowClient(FixMatchClient):
    """A client whose work marks its start (a file named by its id in the folder the
    environment's :data:`STARTED` names), then takes a minute."""

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        Path(os.environ[STARTED], str(client.client_id)).touch()
        time.sleep(60)
        return super().objective(payload, client, state)


class Slow(FedAvgFixMatch):
    """FedAvg-FixMatch with :class:`SlowClient`."""

    def client_side(self) -> ClientSide:
        return SlowClient(self)
