"""The machine's facts that fedlit asks: the CPU cores this process may run on and the memory
free now. Standard library only, so that any module may ask them without importing more."""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory this machine can give now (Linux's ``MemAvailable``), or None where
    it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says it, which a
    container's or a job scheduler's limit narrows; else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def positive_env(name: str) -> int | None:
    """The positive integer in environment variable ``name`` (a setting of this machine's
    that overrides a fact above: the cores to use, the memory to take), None where unset;
    ValueError naming it otherwise."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r}: give a positive integer")
    return value
