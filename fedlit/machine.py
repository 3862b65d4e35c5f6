"""The machine's facts that fedlit asks: the CPU cores this process may run on, the memory
free now and whether the CPU computes bf16. Standard library only at import, so that any
module may ask them without importing more."""

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


#: Set to "0" or "1", says whether this CPU computes bf16 natively instead of asking torch (the
#: tests set "0", so that they run in fp32 on every CPU, in subprocesses and workers too).
CPU_BF16_ENV = "FEDLIT_CPU_BF16"


def cpu_computes_bf16() -> bool:
    """Whether this CPU computes bf16 natively: AVX-512 BF16 or AMX tiles, as torch's CPU
    capability checks see them (:data:`CPU_BF16_ENV` overrides them)."""
    forced = os.environ.get(CPU_BF16_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    import torch  # only here: the other facts need no torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)
