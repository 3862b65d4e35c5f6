"""How a federation runs (a recipe's ``federation`` group) and what a run returns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedlit.evaluation import PROTOCOLS
from fedlit.federation.executors import RaySettings, check_executor
from fedlit.federation.pool import PoolSettings
from fedlit.run_layout import PLACEMENT_KEYS

#: Settings a resume may change without saying so: how long the run goes on, where it is
#: written, what is logged or shown, how often it is evaluated and where the data is read from.
#: A key also covers the keys under it (``trainer.logger`` covers ``trainer.logger.init_args.*``).
RESUME_MAY_CHANGE = (
    *PLACEMENT_KEYS,
    "federation.rounds",
    "federation.eval_every",
    "federation.min_clients",
)

#: ``federation.compile``: torch.compile's modes for the whole training step (None: eager).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")

DEFAULT_RAY = RaySettings()
DEFAULT_POOL = PoolSettings()


@dataclass(frozen=True)
class FederationConfig:
    """How the federation runs (the ``federation`` group of a recipe).

    Args:
        rounds: communication rounds.
        clients_per_round: C, clients sampled per round (without replacement).
        local_epochs: E, epochs of each client's objective per round.
        local_steps: if set, T local steps per round instead of epochs (paper 004's period T).
        server_epochs: E_s, epochs of the server's objective per round.
        eval_every: evaluate on the test set every this many rounds (and after the last).
        resume: a checkpoint to continue from (``<run>/checkpoints/last.ckpt``), into its own
            run directory or a new one. Every setting that changes results must equal the
            checkpoint's. None: a new run (an empty string is refused).
        init_from: a warm start: the run starts from the scored network of another run (its
            run directory, or a federation checkpoint ``<run>/checkpoints/last.ckpt``), read
            with ``torch.load(weights_only=True)``; each method seeds its networks from it
            (:meth:`~fedlit.methods.FederatedMethod.warm_start`) and the plan's bootstrap is
            skipped. A network of another backbone, input or class count, or a method that
            cannot take it, is refused before any work. The source's path and the SHA-256 of
            its weights go into ``run.json`` (``init_from``). A resume continues from its own
            checkpoint and does not read the source again. None: a fresh start.
        resume_may_change: settings (dotted keys as in the config, e.g.
            ``model.init_args.optim.client_lr``) a resume may change besides rounds, eval_every,
            the run directory, loggers and the data root. Each must name a setting (checked
            on every run, not only on a resume).
        final_eval: protocols run on the global encoder after the last round, logged as
            ``eval/<protocol>_acc``: "finetune" (end to end) and/or "linear" (frozen encoder).
        eval_epochs: epochs of those protocols on the server's labeled set.
        eval_lr: their learning rate (SGD, momentum 0.9).
        min_clients: the fewest clients a round may aggregate. A client whose work raises, or
            whose upload holds NaN or an infinity, is left out of its round (logged as
            ``fault/*``); a round left with fewer clients stops the run
            (:class:`~fedlit.federation.faults.RoundFailed`), its last checkpoint kept.
        executor: where the clients' work runs: "local" (in this process, one client after
            another), "pool" (worker processes on this machine, in parallel) or "ray" (Ray
            actors in parallel, on this machine or a cluster), or another name in
            :data:`~fedlit.federation.executors.EXECUTORS`; the same results at the same
            torch thread count. It may be changed on resume.
        pool: the pool executor's settings (:class:`~fedlit.federation.pool.PoolSettings`:
            ``workers``, ``threads`` per worker, ``max_retries``).
        ray: the Ray executor's settings (:class:`~fedlit.federation.executors.RaySettings`:
            ``address``, ``workers``, ``cpus`` and ``gpus`` per client, ``max_retries``).
        compile: ``torch.compile``'s mode for every server and client training step, compiled
            whole: the views, the forward passes, the loss and the backward
            (:mod:`~fedlit.federation.fit.compiled`; "default", "reduce-overhead": CUDA graphs on
            a GPU, "max-autotune"); null (the default) runs eager. Results agree with eager's
            to rounding, not bit for bit.
        labels: names ``run.json`` records for this run beside what the run knows of itself
            (a comparison gives each run its recipe's name as ``method``, its ``setting`` and
            its ``recipe``); a label named ``method`` or ``seed`` replaces the run's own. What
            a run is called, not what it computes: a resume may change them.
        val_only: evaluate on the server's validation split alone, never on the test set (no
            ``test/*``, nor a warm start's or bootstrap's test accuracy), and record which
            validation images the network classifies right each round
            (:data:`~fedlit.run_layout.VAL_CORRECT_FILE`): a tuning trial's run, whose choice
            is made on ``val/*`` and whose selection noise is measured image by image.
    """

    rounds: int = 10
    clients_per_round: int = 10
    local_epochs: int = 1
    local_steps: int | None = None
    server_epochs: int = 1
    eval_every: int = 1
    resume: str | None = None
    init_from: str | None = None
    resume_may_change: tuple[str, ...] = ()
    final_eval: tuple[str, ...] = ()
    eval_epochs: int = 20
    eval_lr: float = 0.03
    min_clients: int = 1
    executor: str = "local"
    pool: PoolSettings = DEFAULT_POOL
    ray: RaySettings = DEFAULT_RAY
    compile: Literal["default", "reduce-overhead", "max-autotune"] | None = None
    labels: dict[str, str] | None = None
    val_only: bool = False

    def __post_init__(self) -> None:
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(
                f"federation.compile must be one of {COMPILE_MODES} or null, got {self.compile!r}"
            )
        check_executor(self.executor)
        unknown = [p for p in self.final_eval if p not in PROTOCOLS]
        if unknown:
            raise ValueError(
                f"federation.final_eval: unknown protocol {unknown[0]!r}; choose from {PROTOCOLS}"
            )
        if not (math.isfinite(self.eval_lr) and self.eval_lr > 0):
            raise ValueError(f"federation.eval_lr must be finite and > 0, got {self.eval_lr}")
        if self.eval_epochs < 1:
            raise ValueError(f"federation.eval_epochs must be positive, got {self.eval_epochs}")
        for key in (
            "rounds",
            "clients_per_round",
            "local_epochs",
            "server_epochs",
            "eval_every",
            "min_clients",
        ):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"federation.{key} must be a positive integer, got {value!r}")
        if self.resume is not None and not str(self.resume).strip():
            raise ValueError(
                f"federation.resume={self.resume!r}: empty; give a checkpoint "
                "(<run>/checkpoints/last.ckpt), or leave it unset (null) for a new run"
            )
        if self.init_from is not None and not str(self.init_from).strip():
            raise ValueError(
                f"federation.init_from={self.init_from!r}: empty; give a run directory or its "
                "checkpoint (<run>/checkpoints/last.ckpt), or leave it unset (null)"
            )
        if self.local_steps is not None and self.local_steps < 1:
            raise ValueError(f"federation.local_steps must be positive, got {self.local_steps}")


@dataclass(frozen=True)
class FederationResult:
    """What a run returns: every round's logged metrics and where it wrote."""

    history: list[dict[str, float]]
    run_dir: Path
    checkpoint: Path

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}
