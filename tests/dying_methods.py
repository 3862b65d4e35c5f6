"""A method whose worker process dies once, for the Ray executor's retry test. A module of its
own so that Ray's worker processes can import it (the test puts this folder on PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from fedlit.data import ClientData
from fedlit.methods import FedAvgFixMatch
from fedlit.methods.base import Payload
from fedlit.objectives import Objective

#: The file whose absence makes a worker die (its creation marks that one died).
MARKER = "FEDLIT_TEST_DIE_ONCE"


class DiesOnce(FedAvgFixMatch):
    """FedAvg-FixMatch whose worker process is killed (SIGKILL) while client 1 starts its
    round-1 work, the first time only."""

    def client_objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        marker = Path(os.environ[MARKER])
        if self.round_idx == 1 and client.client_id == 1 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().client_objective(payload, client, state)
