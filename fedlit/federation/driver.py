"""The federation driver: the round loop shared by every method, and nothing method-specific.

Each round: (server step) -> sample C of K clients -> broadcast -> client steps -> aggregate ->
(server step) -> evaluate -> log -> checkpoint. Whether the server trains before broadcasting
or after aggregating is the method's ``server_first``. A client that raises or uploads a
non-finite value is left out of its round (:mod:`fedlit.federation.faults`); too few clients
left, or a global model that is no longer finite, stops the run before the round is written.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger, WandbLogger
from torch import Tensor
from tqdm.auto import tqdm

from fedlit.aggregation import weight_diversity
from fedlit.aggregation.payloads import flatten_payload, payload_bytes
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.sampling import sample_clients
from fedlit.evaluation import PROTOCOLS, Evaluator, evaluate_encoder, scored
from fedlit.federation.checkpoint import load_checkpoint, save_checkpoint
from fedlit.federation.client import ClientRunner
from fedlit.federation.faults import (
    ROUND_FAILED,
    ClientFault,
    RoundFailed,
    fault_metrics,
    name_list,
    nonfinite_tensors,
    upload_fault,
)
from fedlit.federation.loggers import RoundCSVLogger, drop_rounds_after
from fedlit.federation.rundir import (
    RunLock,
    check_creatable,
    checkpoint_run_dir,
    is_dead_run,
    remove_dead_run,
    run_markers,
    same_dir,
)
from fedlit.federation.seeding import (
    EVAL,
    FINETUNE,
    INIT,
    SERVER,
    derive_seed,
    rng_states,
    seed_all,
    set_rng_states,
)
from fedlit.federation.store import ClientStateStore
from fedlit.federation.trainers import TrainerTemplate
from fedlit.methods.base import ClientUpdate, FederatedMethod
from fedlit.run_layout import CHECKPOINT, RUN_FILE, RUN_MARKERS

__all__ = ["RUN_FILE", "RUN_MARKERS", "Federation", "FederationConfig", "FederationResult"]

#: Settings a resume may change without saying so: how long the run goes on, where it is
#: written, what is logged or shown, how often it is evaluated and where the data is read from.
#: A key also covers the keys under it (``trainer.logger`` covers ``trainer.logger.init_args.*``).
RESUME_MAY_CHANGE = (
    "config",
    "federation.rounds",
    "federation.resume",
    "federation.resume_may_change",
    "federation.eval_every",
    "federation.min_clients",
    "data.root",
    "data.download",
    "trainer.default_root_dir",
    "trainer.logger",
    "trainer.callbacks",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.enable_checkpointing",
    "trainer.log_every_n_steps",
    "trainer.profiler",
)


def _covers(allowed: str, key: str) -> bool:
    """Whether setting ``allowed`` is ``key`` or a group holding it."""
    return key == allowed or key.startswith(allowed + ".")


@contextmanager
def loading_data(data: FederatedDataModule) -> Iterator[None]:
    """Turn a data set that cannot be loaded (missing with ``data.download`` off, no network,
    unreadable files) into a ValueError naming ``data.root`` and ``data.dataset``."""
    try:
        yield
    except (RuntimeError, OSError) as err:
        raise ValueError(
            f"data.root: data.dataset={data.dataset!r} could not be loaded from {data.root} "
            f"(data.download={data.download}): {err}"
        ) from err


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
            checkpoint's.
        resume_may_change: settings (dotted keys as in the config, e.g.
            ``model.init_args.optim.client_lr``) a resume may change besides rounds, eval_every,
            the run directory, loggers and the data root.
        final_eval: protocols run on the global encoder after the last round, logged as
            ``eval/<protocol>_acc``: "finetune" (end to end) and/or "linear" (frozen encoder).
        eval_epochs: epochs of those protocols on the server's labeled set.
        eval_lr: their learning rate (SGD, momentum 0.9).
        min_clients: the fewest clients a round may aggregate. A client whose work raises, or
            whose upload holds NaN or an infinity, is left out of its round (logged as
            ``fault/*``); a round left with fewer clients stops the run
            (:class:`~fedlit.federation.faults.RoundFailed`), its last checkpoint kept.
    """

    rounds: int = 10
    clients_per_round: int = 10
    local_epochs: int = 1
    local_steps: int | None = None
    server_epochs: int = 1
    eval_every: int = 1
    resume: str | None = None
    resume_may_change: tuple[str, ...] = ()
    final_eval: tuple[str, ...] = ()
    eval_epochs: int = 20
    eval_lr: float = 0.03
    min_clients: int = 1

    def __post_init__(self) -> None:
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


@dataclass
class Federation:
    """Runs ``method`` on ``data`` for ``config.rounds`` rounds.

    Call :meth:`prepare` (loads data, checks every setting, raises ValueError naming the key
    before anything is written or trained), then :meth:`run`. The run directory is locked
    (:class:`~fedlit.federation.rundir.RunLock`) from :meth:`open_run_dir` to the end of
    :meth:`run`.
    """

    method: FederatedMethod
    data: FederatedDataModule
    config: FederationConfig
    run_dir: Path
    seed: int = 0
    trainer: TrainerTemplate = field(default_factory=TrainerTemplate)
    loggers: Sequence[Logger] = ()
    hparams: dict[str, Any] = field(default_factory=dict)
    progress: bool | None = None  # None: a bar on a terminal, plain lines otherwise

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.store = ClientStateStore()
        self.visits: dict[int, int] = {}  # client id -> rounds it has been selected in
        self.history: list[dict[str, float]] = []
        self.start_round = 1
        self._prepared = False
        self._dead = False  # the directory holds a run that died before its first checkpoint
        self._opened = False  # open_run_dir has run: the directory is locked and ready
        self._lock = RunLock(self.run_dir)

    # --- checks and set-up ---------------------------------------------------------------
    def prepare(self) -> None:
        """Validate everything and load the data; raises ValueError naming the offending key.

        Nothing is written; a run directory another process is writing is refused first.
        """
        check_creatable(self.run_dir)
        self._lock.acquire(create=False)  # only where a lock file exists: nothing is written
        try:
            self._prepare()
        except BaseException:
            self._lock.release()
            raise

    def _prepare(self) -> None:
        cfg = self.config
        ckpt = load_checkpoint(cfg.resume) if cfg.resume else None
        self._check_run_dir()
        if ckpt is not None:  # before the data are loaded
            self._check_resume(ckpt)
        if self.method.uses_clients and cfg.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"federation.clients_per_round={cfg.clients_per_round} exceeds "
                f"data.num_clients={self.data.num_clients}"
            )
        if self.method.uses_clients and cfg.min_clients > cfg.clients_per_round:
            raise ValueError(
                f"federation.min_clients={cfg.min_clients} exceeds "
                f"federation.clients_per_round={cfg.clients_per_round}"
            )
        if self.data.labels_at == "client":
            if not self.method.supports_labels_at_client:
                raise ValueError(
                    f"data.labels_at='client': {type(self.method).__name__} trains on the "
                    "server's labels; use labels_at='server'"
                )
            if cfg.final_eval:
                raise ValueError(
                    "federation.final_eval needs the server's labeled set, which "
                    "data.labels_at='client' leaves empty"
                )
        if (self.method.num_classes, self.method.in_channels) != (
            self.data.num_classes,
            self.data.in_channels,
        ):
            raise ValueError(
                "model.num_classes / model.in_channels do not match data.dataset "
                f"{self.data.dataset!r} ({self.data.num_classes} classes, "
                f"{self.data.in_channels} channels)"
            )
        with loading_data(self.data):
            self.data.setup_federation(self.seed)
        self.method.validate_data(self.data)
        if ckpt is not None:
            self._restore(ckpt)
        else:  # the initial global network comes from the run's seed too
            seed_all(derive_seed(self.seed, 0, INIT))
            self.method.initialize()
        self.runner = ClientRunner(
            method=self.method,
            data=self.data,
            trainer=self.trainer,
            seed=self.seed,
            total_rounds=cfg.rounds,
            local_epochs=cfg.local_epochs,
            local_steps=cfg.local_steps,
        )
        self._prepared = True

    def _check_run_dir(self) -> None:
        """Refuse a run directory that holds a run this one does not continue. A directory whose
        run died before its first checkpoint is noted (:meth:`open_run_dir` clears it)."""
        self._dead = is_dead_run(self.run_dir)
        found = run_markers(self.run_dir)
        if not found or self._dead:
            return
        resume = self.config.resume
        if resume is None:
            raise ValueError(
                f"trainer.default_root_dir: {self.run_dir} already holds a run "
                f"({', '.join(found)}); choose another directory, or continue it with "
                f"--federation.resume {self.checkpoint_path}"
            )
        origin = checkpoint_run_dir(resume)
        if not same_dir(origin, self.run_dir):
            raise ValueError(
                f"federation.resume: the checkpoint {resume} belongs to the run in {origin}, "
                f"but trainer.default_root_dir {self.run_dir} holds a different run "
                f"({', '.join(found)}); resume into {origin} or into a new directory"
            )

    def open_run_dir(self) -> None:
        """Create and lock the run directory, then make it ready to write: a run that died there
        before its first checkpoint is removed (with a note), and a resume drops the rows
        ``metrics.csv`` holds after the checkpoint's round (logged by a run killed between
        its metrics and its checkpoint). Raises ValueError if another process holds the lock
        or wrote a run there since :meth:`prepare`."""
        if not self._prepared:
            self.prepare()
        if self._opened:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._check_run_dir()  # again, under the lock
            if self._dead:
                removed = remove_dead_run(self.run_dir)
                _note(
                    f"{self.run_dir} held a run stopped before its first checkpoint; "
                    f"removed its {', '.join(removed)} and started afresh"
                )
                self._dead = False
            if self.start_round > 1:
                dropped = drop_rounds_after(self.run_dir / "metrics.csv", self.start_round - 1)
                if dropped:
                    _note(
                        f"{self.run_dir / 'metrics.csv'}: dropped {dropped} row(s) logged after "
                        f"round {self.start_round - 1}, the checkpoint's; they are run again"
                    )
            self._opened = True
        except BaseException:
            self._lock.release()
            raise

    def _meta(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "method": type(self.method).__name__,
            "num_clients": self.data.num_clients,
            "dataset": self.data.dataset,
        }

    def _check_settings(self, saved: dict[str, Any]) -> None:
        """Refuse a resume whose settings differ from the checkpoint's (``saved``, its flat
        config) in a key that changes results; :data:`RESUME_MAY_CHANGE` and
        ``federation.resume_may_change`` may differ. Keys only one side has (settings added
        by a newer version) are not compared."""
        allowed = (*RESUME_MAY_CHANGE, *self.config.resume_may_change)
        for name in self.config.resume_may_change:
            if self.hparams and not any(_covers(name, key) for key in self.hparams):
                raise ValueError(f"federation.resume_may_change: no setting named {name!r}")
        if not saved or not self.hparams:
            return
        for key in sorted(saved.keys() & self.hparams.keys()):
            if saved[key] != self.hparams[key] and not any(_covers(a, key) for a in allowed):
                raise ValueError(
                    f"federation.resume: {key}={self.hparams[key]!r} but the checkpoint was "
                    f"made with {key}={saved[key]!r}; resume with the checkpoint's setting, or "
                    f"allow the change with --federation.resume_may_change=[{key}]"
                )

    def _check_resume(self, ckpt: dict[str, Any]) -> None:
        """Refuse a checkpoint made by another run (seed, method, clients, data set), with
        other settings, or with no round left to run."""
        self._check_settings(ckpt.get("hparams") or {})
        meta = self._meta()
        for key, value in ckpt["meta"].items():
            if meta.get(key) != value:
                raise ValueError(
                    f"federation.resume: the checkpoint was made with {key}={value!r}, "
                    f"this run has {key}={meta.get(key)!r}"
                )
        if ckpt["round"] >= self.config.rounds:
            raise ValueError(
                f"federation.resume: the checkpoint already completed round {ckpt['round']}; "
                f"federation.rounds={self.config.rounds} leaves nothing to run"
            )

    def _restore(self, ckpt: dict[str, Any]) -> None:
        """Continue from ``ckpt``: global and server state, client states, history, RNGs."""
        try:
            self.method.load_state_dict(ckpt["method_state"])
        except (RuntimeError, ValueError) as err:  # another architecture (size mismatch)
            raise ValueError(
                f"federation.resume: the checkpoint's network does not fit this model "
                f"(model.backbone={self.method.backbone_name!r}): {_first_line(err)}"
            ) from err
        self.store.load_state_dict(ckpt["client_states"])
        self.visits = dict(ckpt.get("visits", {}))
        self.history = list(ckpt["history"])
        set_rng_states(ckpt["rng"])
        self.start_round = ckpt["round"] + 1

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> FederationResult:
        """Prepare (if not done), open and lock the run directory (if not done), run the
        remaining rounds; the lock is released when the run ends, however it ends."""
        self.open_run_dir()
        try:
            return self._run()
        finally:
            self.close_run_dir()

    def close_run_dir(self) -> None:
        """Release the run directory's lock (a no-op if not held)."""
        self._lock.release()
        self._opened = False

    def _run(self) -> FederationResult:
        if self.method.oracle:
            _note(
                f"{type(self.method).__name__} is an oracle: its clients train on their true "
                "labels (an upper bound, not a semi-supervised method)"
            )
        if not self.method.private:
            _note(
                f"{type(self.method).__name__} is not private: it sends clients other clients' "
                "models, which standard federated learning does not allow"
            )
        self._write_run_file()
        loggers = [RoundCSVLogger(self.run_dir), *self.loggers]
        if self.start_round == 1:
            row = {"round": 0, **self.data.partition_summary(), **self._bootstrap()}
            for logger in loggers:
                logger.log_hyperparams(self.hparams)
                logger.log_metrics(row, step=0)
            self._log_partition_image(loggers)
        bar = self._progress_bar()
        try:
            for round_idx in range(self.start_round, self.config.rounds + 1):
                metrics = self.run_and_record_round(round_idx, loggers)
                self._report(bar, round_idx, metrics)
        except RoundFailed:
            for logger in loggers:
                logger.finalize("failed")
                if isinstance(logger, WandbLogger):
                    logger.experiment.finish(exit_code=ROUND_FAILED)
            raise
        finally:
            if bar is not None:
                bar.close()
        for logger in loggers:
            logger.finalize("success")
            if isinstance(logger, WandbLogger):  # end its W&B run: the next run starts its own
                logger.experiment.finish()
        return FederationResult(list(self.history), self.run_dir, self.checkpoint_path)

    def _write_run_file(self) -> None:
        """``run.json``: who this run is (kept where a comparison already named it) and how
        many rounds it is configured for, so reports can read runs without their config."""
        path = self.run_dir / RUN_FILE
        info = json.loads(path.read_text()) if path.is_file() else {}
        info.setdefault("method", type(self.method).__name__)
        info.setdefault("seed", self.seed)
        info["rounds"] = self.config.rounds
        info["marks"] = list(self.method.marks())
        path.write_text(json.dumps(info))

    def _log_partition_image(self, loggers: Sequence[Logger]) -> None:
        """The clients' class counts as a heat map, for loggers that take images (W&B)."""
        imaging = [logger for logger in loggers if hasattr(logger, "log_image")]
        if not imaging:
            return
        from fedlit.reporting import plot_partition  # matplotlib only when it is needed

        title = f"{self.data.dataset}: R = {self.data.non_iid_R:.3f}"
        path = plot_partition(self.data.class_counts, self.run_dir / "partition.png", title)
        for logger in imaging:
            logger.log_image(key="partition", images=[str(path)], step=0)

    def run_and_record_round(self, round_idx: int, loggers: Sequence[Logger]) -> dict[str, float]:
        """One round, then its log rows and its checkpoint."""
        metrics = self.run_round(round_idx)
        self.history.append(metrics)
        for logger in loggers:
            logger.log_metrics(metrics, step=round_idx)
            logger.save()
        self._checkpoint(round_idx)
        return metrics

    def run_round(self, round_idx: int) -> dict[str, float]:
        """One round; returns its metrics."""
        t0 = time.perf_counter()
        method, cfg = self.method, self.config
        metrics: dict[str, float] = {"round": float(round_idx)}
        method.on_round_start(round_idx, cfg.rounds)
        if method.server_first or not method.uses_clients:
            metrics |= self._server_step(round_idx)
        down: Counter[str] = Counter()  # bytes sent down / up, by payload part
        up: Counter[str] = Counter()
        if method.uses_clients:
            clients = sample_clients(
                self.data.num_clients, cfg.clients_per_round, self.seed, round_idx
            )
            payload = method.broadcast()
            updates: list[ClientUpdate] = []
            received: list[dict[str, Tensor]] = []
            faults: list[ClientFault] = []
            for cid in clients.tolist():
                self.visits[cid] = self.visits.get(cid, 0) + 1  # a faulty visit counts too
                sent = method.client_payload(payload, cid)
                down.update(payload_bytes(sent))
                try:
                    update = self.runner(
                        sent, cid, round_idx, self.store.get(cid), self.visits[cid]
                    )
                except Exception as err:  # not KeyboardInterrupt, SIGTERM: those stop the run
                    why = ": ".join(filter(None, (type(err).__name__, _first_line(err))))
                    fault: ClientFault | None = ClientFault(cid, "raised", why)
                else:
                    up.update(payload_bytes(update.upload))
                    fault = upload_fault(cid, update.upload)
                if fault is not None:  # left out; its persistent state stays as it was
                    faults.append(fault)
                    _warn(f"round {round_idx}: {fault.describe()}; left out of the round")
                    continue
                self.store.put(cid, update.state)
                updates.append(update)
                received.append(flatten_payload(sent))
            if method.all_clients_receive:  # the others receive the round's broadcast too
                idle = sorted(set(range(self.data.num_clients)) - set(clients.tolist()))
                for part, n in payload_bytes(payload).items():
                    down[part] += n * len(idle)
                states = self.runner.receive(
                    payload,
                    idle,
                    [self.store.get(cid) for cid in idle],
                    [max(self.visits.get(cid, 0), 1) for cid in idle],
                )
                for cid, state in zip(idle, states, strict=True):
                    self.store.put(cid, state)
            self._check_survivors(round_idx, len(clients), updates, faults)
            metrics |= fault_metrics(faults)
            metrics["diag/weight_diversity"] = weight_diversity(
                received, [flatten_payload(u.upload) for u in updates]
            )
            method.aggregate(updates)
            self._check_finite(round_idx, "aggregation")
            metrics |= _mean_metrics("client", [u.metrics for u in updates])
            if not method.server_first:
                metrics |= self._server_step(round_idx)
            elif method.server_finetunes:  # paper 000's Algorithm 1: fine-tune the aggregate
                metrics |= self._server_step(round_idx, stage="finetune")
        method.end_round()
        self._check_finite(round_idx, "the end of the round (end_round)")
        if round_idx % cfg.eval_every == 0 or round_idx == cfg.rounds:
            metrics |= self.evaluate()
        if round_idx == cfg.rounds:
            metrics |= self.evaluate_encoder()
        for direction, counts in (("down", down), ("up", up)):  # in all, then by part
            metrics[f"comm/bytes_{direction}"] = float(sum(counts.values()))
            metrics |= {f"comm/bytes_{direction}/{part}": float(n) for part, n in counts.items()}
        metrics["time/round_s"] = time.perf_counter() - t0
        return metrics

    def _check_survivors(
        self,
        round_idx: int,
        sampled: int,
        updates: Sequence[ClientUpdate],
        faults: Sequence[ClientFault],
    ) -> None:
        """Stop the run (:class:`RoundFailed`) if fewer than ``federation.min_clients`` of the
        round's ``sampled`` clients survived; the message names the round and the faults."""
        if len(updates) >= self.config.min_clients:
            return
        raise RoundFailed(
            f"round {round_idx}: {len(updates)} of {sampled} clients survived, fewer than "
            f"federation.min_clients={self.config.min_clients} "
            f"({'; '.join(f.describe() for f in faults)}); {self._kept(round_idx)}"
        )

    def _check_finite(self, round_idx: int, stage: str) -> None:
        """Stop the run (:class:`RoundFailed`) if a floating-point tensor of the method's state
        (its networks, buffers and extra state) holds NaN or an infinity after
        ``stage``: a model that is no longer finite is never evaluated or checkpointed."""
        bad = nonfinite_tensors(self.method.state_dict())
        if bad:
            raise RoundFailed(
                f"round {round_idx}: the global model is not finite after {stage} "
                f"({name_list(bad)}); {self._kept(round_idx)}"
            )

    def _kept(self, round_idx: int) -> str:
        """What a run stopped in round ``round_idx`` leaves: its last good checkpoint."""
        if round_idx > 1 and self.checkpoint_path.is_file():
            return (
                f"the run stops; nothing of round {round_idx} is written and its last "
                f"checkpoint, round {round_idx - 1}, is kept: {self.checkpoint_path}"
            )
        return f"the run stops in round {round_idx}, before its first checkpoint"

    def _server_step(
        self, round_idx: int, epochs: int | None = None, stage: str = "server"
    ) -> dict[str, float]:
        """The server's objective for ``epochs`` (``server_epochs``), logged as ``<stage>/*``
        (``finetune``: a second step in the round, after aggregation, on its own seed)."""
        if self.data.labels_at == "client":  # no labels at the server: nothing to train
            return {}
        objective = self.method.server_objective()
        if objective is None:
            return {}
        seed_all(derive_seed(self.seed, round_idx, FINETUNE if stage == "finetune" else SERVER))
        loader = self.method.server_loader(self.data)
        self.trainer.fit(objective, loader, epochs or self.config.server_epochs)
        self.method.server_step_done(objective, self.data)
        self._check_finite(round_idx, f"the {stage} step")
        return {f"{stage}/{k}": v for k, v in objective.epoch_metrics().items()}

    def _bootstrap(self) -> dict[str, float]:
        """The method's bootstrap (FedSEAL): its server objective for ``bootstrap_epochs``
        before round 1, logged in row 0 as ``bootstrap/*`` with w^0's ``bootstrap_test/acc``."""
        epochs = self.method.bootstrap_epochs
        if epochs == 0 or self.data.labels_at == "client":
            return {}
        self.method.on_round_start(0, self.config.rounds)
        trained = self._server_step(0, epochs)
        metrics = {k.replace("server/", "bootstrap/", 1): v for k, v in trained.items()}
        return metrics | self.evaluate("bootstrap_test")

    def evaluate(self, prefix: str = "test") -> dict[str, float]:
        """Top-1 accuracy and loss of the method's evaluation network on the test set, its
        BatchNorm statistics re-estimated on the server's clean images (:func:`scored`)."""
        seed_all(derive_seed(self.seed, 0, EVAL))
        network = scored(self.method.eval_network(), self.data, self.trainer.device())
        evaluator = Evaluator(network, self.data.num_classes)
        self.trainer.test(evaluator, self.data.test_dataloader())
        return evaluator.metrics(prefix)

    def evaluate_encoder(self) -> dict[str, float]:
        """The configured protocols (finetune, linear) on the global encoder: ``eval/<p>_acc``."""
        out = {}
        for protocol in self.config.final_eval:
            seed_all(derive_seed(self.seed, self.config.rounds, EVAL))
            out[f"eval/{protocol}_acc"] = evaluate_encoder(
                self.method.encoder(),
                protocol,
                self.data,
                self.trainer,
                epochs=self.config.eval_epochs,
                lr=self.config.eval_lr,
            )
        return out

    # --- checkpoints and reporting -----------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT

    def _checkpoint(self, round_idx: int) -> None:
        save_checkpoint(
            self.checkpoint_path,
            {
                "round": round_idx,
                "method_state": self.method.state_dict(),
                "client_states": self.store.state_dict(),
                "visits": dict(self.visits),
                "history": self.history,
                "rng": rng_states(),
                "meta": self._meta(),
                "hparams": self.hparams,
            },
        )

    def _progress_bar(self) -> tqdm | None:
        show = sys.stderr.isatty() if self.progress is None else self.progress
        if not show:
            return None
        return tqdm(
            total=self.config.rounds,
            initial=self.start_round - 1,
            desc="rounds",
            unit="round",
            dynamic_ncols=True,
        )

    def _report(self, bar: tqdm | None, round_idx: int, metrics: dict[str, float]) -> None:
        acc = metrics.get("test/acc")
        text = f"acc {acc:.4f}" if acc is not None else "acc -"
        if bar is not None:
            bar.set_postfix_str(f"{text}, {metrics['time/round_s']:.1f} s/round")
            bar.update(1)
        elif self.progress is None:
            print(
                f"round {round_idx}/{self.config.rounds}  {text}  {metrics['time/round_s']:.1f} s",
                flush=True,
            )


def _note(text: str) -> None:
    """A line for the person running fedlit (stderr: stdout carries the results)."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def _warn(text: str) -> None:
    """A warning line on stderr (through tqdm, so that a progress bar stays intact)."""
    tqdm.write(f"warning: {text}", file=sys.stderr)


def _first_line(err: BaseException) -> str:
    """An error's message, its details (one line per mismatched tensor) cut to two lines."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:2]) + (" ..." if len(lines) > 2 else "")


def _mean_metrics(prefix: str, per_client: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the clients that report it, as ``<prefix>/<name>``; names that
    carry their own namespace (``pseudo/pos_acc``, ``kl/teacher``) are kept as they are."""
    keys = sorted({k for m in per_client for k in m})
    return {
        (k if "/" in k else f"{prefix}/{k}"): float(np.mean([m[k] for m in per_client if k in m]))
        for k in keys
    }
