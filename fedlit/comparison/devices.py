"""Which GPU each of a comparison's parallel fits trains on: on a machine with several, each
child ``fedlit fit`` sees one (``CUDA_VISIBLE_DEVICES``), the one with the fewest fits
running, so ``jobs: N`` spreads its runs over the GPUs instead of piling them onto the
first. A fit's results do not depend on which GPU it gets."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The variable that says which GPUs a process sees.
VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus() -> list[str]:
    """The names of this process's visible GPUs as ``CUDA_VISIBLE_DEVICES`` spells them (its
    entries where set, else their indices), as many as torch counts; none without CUDA."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    given = [d.strip() for d in os.environ.get(VISIBLE, "").split(",") if d.strip()]
    return (given or [str(i) for i in range(count)])[:count]


class GpuSlots:
    """Hands each fit the GPU with the fewest fits running (the lowest index on a tie)."""

    def __init__(self, gpus: list[str]) -> None:
        self.running = dict.fromkeys(gpus, 0)
        self._lock = threading.Lock()

    @contextmanager
    def taken(self) -> Iterator[dict[str, str]]:
        """While the block runs, one fit holds a GPU: the environment its process gets
        (``CUDA_VISIBLE_DEVICES``; nothing on a machine with fewer than two GPUs)."""
        if len(self.running) < 2:
            yield {}
            return
        with self._lock:
            gpu = min(self.running, key=lambda g: self.running[g])
            self.running[gpu] += 1
        try:
            yield {VISIBLE: gpu}
        finally:
            with self._lock:
                self.running[gpu] -= 1
