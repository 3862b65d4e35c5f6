"""A child process's tie to its parent: it ends as soon as the parent is gone, a parent killed
with SIGKILL included. Standard library only, so that a worker is tied before its own imports
(seconds of torch) run: a parent killed while its workers start leaves none behind.

Two means: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``: the kernel signals the
child when the parent ends, whatever the child is doing, even holding the interpreter's lock in
a long import), and a thread that waits on the parent (:func:`exit_with_parent`: on any
system, once the child runs Python). ``fedlit compare``'s ``fedlit fit`` processes set the
signal between fork and exec (:func:`die_with_parent`); the pool's workers, which
multiprocessing starts with no such hook, set it at their first line (:func:`run_tied`)."""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import wait
from typing import Any

#: ``prctl``'s option that sends the calling process a signal when its parent dies.
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def parent_death_signal(signum: int) -> None:
    """Receive ``signum`` when the parent dies (Linux; 0: no longer). The kernel sends it when
    the thread that started this process ends: set it while that thread waits on the child."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signum)


def die_with_parent(parent: int) -> None:
    """In a child, between fork and exec: receive SIGTERM when the parent dies (Linux), and
    end at once if it already has."""
    parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def exit_with_parent() -> None:
    """In a process multiprocessing started: end it as soon as the process that started it
    is gone (killed, not only stopped), by a thread that waits on the parent's sentinel."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="fedlit-parent-watch", daemon=True).start()


def run_tied(target: str, *args: Any) -> Any:
    """A multiprocessing ``Process``'s target: tie this process to its parent, SIGKILL by the
    parent-death signal (until the target calls ``parent_death_signal(0)``, once set up) and a
    thread for life (:func:`exit_with_parent`), then import ``target`` ("module:function")
    and call it with ``args``. The target is named, not pickled, so that its module's imports
    run after the tie."""
    parent_death_signal(signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # gone before the signal was set
        os._exit(1)
    exit_with_parent()
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args)
