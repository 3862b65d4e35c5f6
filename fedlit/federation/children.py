"""``fedlit compare``'s ``fedlit fit`` processes, stopped with it (:class:`Children`): a signal
is passed on to them, and each is tied to the comparison's life
(:func:`~fedlit.lifeline.die_with_parent`)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import FrameType

from fedlit.lifeline import die_with_parent


class Children:
    """The processes a comparison runs (its ``fedlit fit`` runs), stopped with it: a SIGTERM
    or SIGINT is passed on to each running child (:meth:`forwarding_signals`), and each is
    started with the parent-death signal (:func:`die_with_parent`), so that even a SIGKILL
    of the comparison stops them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running: set[subprocess.Popen[bytes]] = set()
        self.stopped_by: int | None = None  # the signal that stopped the comparison

    def start(self, args: Sequence[str], **popen: object) -> subprocess.Popen[bytes] | None:
        """Start a child (None once the comparison is stopping: start no more)."""
        with self._lock:
            if self.stopped_by is not None:
                return None
            proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
                args, preexec_fn=functools.partial(die_with_parent, os.getpid()), **popen
            )
            self.running.add(proc)
            return proc

    def wait(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for ``proc`` to end; its status."""
        code = proc.wait()
        with self._lock:
            self.running.discard(proc)
        return code

    def forward(self, signum: int) -> None:
        """Pass ``signum`` on to every running child, and start no more."""
        with self._lock:
            self.stopped_by = self.stopped_by or signum
            for proc in self.running:
                with suppress(ProcessLookupError):  # ended meanwhile
                    proc.send_signal(signum)

    @contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """While the children run (in the main thread): a SIGTERM or SIGINT is passed on to
        them; then the comparison waits for them to stop and exits with 128 + the signal, also
        where a stopped child's error ended the block (a study's trials)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signums = (signal.SIGTERM, signal.SIGINT)

        def handler(signum: int, frame: FrameType | None) -> None:
            self.forward(signum)

        previous = {sig: signal.signal(sig, handler) for sig in signums}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            if self.stopped_by is not None:  # also over the errors of the fits it stopped
                name = signal.Signals(self.stopped_by).name
                print(
                    f"fedlit compare: stopped by {name}; its fits were stopped too. Run the "
                    "same command again to go on (interrupted runs resume from their "
                    "checkpoints).",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(128 + self.stopped_by)
