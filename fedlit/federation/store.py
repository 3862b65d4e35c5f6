"""The driver's store of every client's persistent state."""

from __future__ import annotations

from typing import Any


class ClientStateStore:
    """Client id -> persistent state (whatever the method keeps; never uploaded).

    Stateless methods leave it empty. It is saved whole in the federation checkpoint.
    """

    def __init__(self) -> None:
        self._states: dict[int, Any] = {}

    def get(self, client_id: int) -> Any:
        return self._states.get(client_id)

    def put(self, client_id: int, state: Any) -> None:
        if state is None:
            self._states.pop(client_id, None)
        else:
            self._states[client_id] = state

    def __len__(self) -> int:
        return len(self._states)

    def state_dict(self) -> dict[int, Any]:
        return dict(self._states)

    def load_state_dict(self, states: dict[int, Any]) -> None:
        self._states = dict(states)
