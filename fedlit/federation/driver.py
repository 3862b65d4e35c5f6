"""The federation driver: checks and set-up, the run directory, resume, and the run: the
rounds of :mod:`fedlit.federation.rounds` between the callbacks of
:mod:`fedlit.federation.callbacks`; the server's steps and the evaluations the rounds call.

A client that raises or uploads a non-finite value is left out of its round
(:mod:`fedlit.federation.faults`); too few clients left, or a global model that is no longer
finite, stops the run before the round is written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

from fedlit.data.datamodule import FederatedDataModule
from fedlit.evaluation import Evaluator, evaluate_encoder, scored
from fedlit.federation.callbacks import Callback, Callbacks, Ending, default_callbacks
from fedlit.federation.checkpoint import load_checkpoint, save_checkpoint
from fedlit.federation.client import ClientRunner
from fedlit.federation.config import RESUME_MAY_CHANGE, FederationConfig, FederationResult
from fedlit.federation.console import first_line, note
from fedlit.federation.executors import ClientExecutor, make_executor
from fedlit.federation.faults import ClientFault, RoundFailed, name_list, nonfinite_tensors
from fedlit.federation.loggers import drop_rounds_after
from fedlit.federation.rounds import run_round
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
from fedlit.federation.store import CLIENT_DIR, ClientStateStore
from fedlit.federation.trainers import (
    TrainerTemplate,
    compile_toolchain_missing,
    stop_on_sigterm,
)
from fedlit.methods.base import ClientUpdate, FederatedMethod
from fedlit.run_layout import CHECKPOINT, CONFIG_FILE, RUN_FILE, RUN_MARKERS

__all__ = ["RUN_FILE", "RUN_MARKERS", "Federation", "FederationConfig", "FederationResult"]


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
    #: What happens around the rounds; None: :func:`~fedlit.federation.callbacks.default_callbacks`
    #: with ``loggers``.
    extra_callbacks: Sequence[Callback] = ()

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.store = ClientStateStore(self.checkpoint_path.parent / CLIENT_DIR)
        self.visits: dict[int, int] = {}  # client id -> rounds it has been selected in
        self.history: list[dict[str, float]] = []
        self.start_round = 1
        self.checkpointed_round = 0  # the round of the run's last checkpoint (0: none yet)
        self._prepared = False
        self._dead = False  # the directory holds a run that died before its first checkpoint
        self._opened = False  # open_run_dir has run: the directory is locked and ready
        self._lock = RunLock(self.run_dir)
        self.callbacks = Callbacks([*default_callbacks(self.loggers), *self.extra_callbacks])

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
            self.close()
            raise

    def _prepare(self) -> None:
        cfg = self.config
        for name in cfg.resume_may_change:  # on every fit, not only on a resume
            if self.hparams and not any(_covers(name, key) for key in self.hparams):
                raise ValueError(f"federation.resume_may_change: no setting named {name!r}")
        self.trainer.check()
        self.method.check_federation(cfg)
        if cfg.compile is not None:
            device = self.trainer.device()
            missing = compile_toolchain_missing(device)
            if missing:
                raise ValueError(
                    f"federation.compile={cfg.compile!r}: torch.compile cannot build kernels "
                    f"for {device.type} here ({missing}); leave federation.compile null"
                )
            self.trainer = replace(self.trainer, compile=cfg.compile)
        try:
            ckpt = load_checkpoint(cfg.resume) if cfg.resume else None
        except ValueError as err:
            named = str(err).startswith("federation.resume")
            raise ValueError(str(err) if named else f"federation.resume: {err}") from err
        self._check_run_dir()
        if ckpt is not None:  # before the data are loaded
            self._check_resume(ckpt)
        uses_clients = self.method.round_plan().uses_clients
        if uses_clients and cfg.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"federation.clients_per_round={cfg.clients_per_round} exceeds "
                f"data.num_clients={self.data.num_clients}"
            )
        if uses_clients and cfg.min_clients > cfg.clients_per_round:
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
        self.method.on_data_ready(self.data)
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
        self._executor: ClientExecutor | None = None
        if cfg.executor == "ray" and uses_clients:
            # connected (or started) and checked against the cluster's resources now, before
            # anything is written; a refusal names the key (federation.ray.*)
            self._executor = self.executor
        self._prepared = True

    @property
    def executor(self) -> ClientExecutor:
        """Where the clients' work runs (``federation.executor``), started on first use and
        stopped when the run ends."""
        if self._executor is None:
            cfg = self.config
            self._executor = make_executor(
                cfg.executor, self.runner, cfg.ray, cfg.clients_per_round, cfg.pool
            )
        return self._executor

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
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"trainer.default_root_dir={str(self.run_dir)!r}: cannot create it: "
                f"{err.strerror or err}"
            ) from err
        self._lock.acquire()
        try:
            self._check_run_dir()  # again, under the lock
            if self._dead:
                removed = remove_dead_run(self.run_dir, self._lock)
                note(
                    f"{self.run_dir} held a run stopped before its first checkpoint; "
                    f"removed its {', '.join(removed)} and started afresh"
                )
                self._dead = False
            self.store.open()  # the resumed run's client states here, nothing else
            if self.start_round > 1:
                dropped = drop_rounds_after(self.run_dir / "metrics.csv", self.start_round - 1)
                if dropped:
                    note(
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
        if not saved or not self.hparams:
            return
        changed = [
            key
            for key in sorted(saved.keys() & self.hparams.keys())
            if saved[key] != self.hparams[key] and not any(_covers(a, key) for a in allowed)
        ]
        if changed:
            assert self.config.resume is not None
            run_config = checkpoint_run_dir(self.config.resume) / CONFIG_FILE
            shown = "; ".join(
                f"{key}={self.hparams[key]!r} (the checkpoint's: {saved[key]!r})" for key in changed
            )
            raise ValueError(
                f"federation.resume: {len(changed)} setting(s) differ from the checkpoint's: "
                f"{shown}. Resume with the run's own config (--config {run_config} "
                f"--federation.resume {self.config.resume}), or allow the change with "
                f"--federation.resume_may_change=[{','.join(changed)}]"
            )

    def _check_resume(self, ckpt: dict[str, Any]) -> None:
        """Refuse a checkpoint made by another run (seed, method, clients, data set), with
        other settings, or with no round left to run."""
        self._check_settings(ckpt.get("hparams") or {})
        meta = self._meta()
        other = [
            f"{key}={value!r}, this run has {meta.get(key)!r}"
            for key, value in ckpt["meta"].items()
            if meta.get(key) != value
        ]
        if other:
            raise ValueError(f"federation.resume: the checkpoint was made with {'; '.join(other)}")
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
                f"(model.backbone={self.method.backbone_name!r}): {first_line(err)}"
            ) from err
        assert self.config.resume is not None
        source = Path(self.config.resume).parent / CLIENT_DIR
        self.store.load_state_dict(ckpt["client_states"], source)
        self.visits = dict(ckpt.get("visits", {}))
        self.history = list(ckpt["history"])
        set_rng_states(ckpt["rng"])
        self.start_round = ckpt["round"] + 1
        self.checkpointed_round = ckpt["round"]
        before = (ckpt.get("hparams") or {}).get("federation.rounds")
        if isinstance(before, int) and before != self.config.rounds:
            done = "round 1" if ckpt["round"] == 1 else f"rounds 1-{ckpt['round']}"
            note(
                f"federation.rounds {before} -> {self.config.rounds}: the run-level schedules "
                f"(learning rate, ramps) are laid out again over {self.config.rounds} rounds "
                f"from round {self.start_round} on; {done} followed the {before}-round "
                f"schedule, so the result differs from a fresh {self.config.rounds}-round run"
            )

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> FederationResult:
        """Prepare (if not done), open and lock the run directory (if not done), run the
        remaining rounds; the lock is released when the run ends, however it ends."""
        with stop_on_sigterm():
            try:
                self.open_run_dir()
                return self._run()
            finally:
                self.close()

    def close_run_dir(self) -> None:
        """Release the run directory's lock (a no-op if not held)."""
        self._lock.release()
        self._opened = False

    def close(self) -> None:
        """Stop the executor (Ray's actors, and a local Ray instance the run started) and
        release the run directory's lock: what :meth:`run` does when the run ends, however it
        ends; also for a run refused after :meth:`prepare`. A no-op the second time."""
        executor = getattr(self, "_executor", None)
        self._executor = None
        try:
            if executor is not None:
                executor.close()
        finally:
            self.close_run_dir()

    def _run(self) -> FederationResult:
        self.callbacks.run_start(self)
        ending: Ending = "stopped"
        try:
            if self.start_round == 1:
                row0 = {"round": 0, **self.data.partition_summary(), **self._bootstrap()}
                self.callbacks.first_row(self, row0)
            for round_idx in range(self.start_round, self.config.rounds + 1):
                self.run_and_record_round(round_idx)
            ending = "success"
        except RoundFailed:
            ending = "failed"
            raise
        finally:
            self.callbacks.run_end(self, ending)
        return FederationResult(list(self.history), self.run_dir, self.checkpoint_path)

    def run_round(self, round_idx: int) -> dict[str, float]:
        """Round ``round_idx`` (:func:`fedlit.federation.rounds.run_round`); its metrics."""
        return run_round(self, round_idx)

    def run_and_record_round(self, round_idx: int) -> dict[str, float]:
        """Round ``round_idx``, then its callbacks (rows, checkpoint, progress)."""
        metrics = self.run_round(round_idx)
        self.history.append(metrics)
        self.callbacks.round_end(self, round_idx, metrics)
        return metrics

    def check_survivors(
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

    def check_finite(self, round_idx: int, stage: str) -> None:
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

    def server_step(
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
        self.check_finite(round_idx, f"the {stage} step")
        return {f"{stage}/{k}": v for k, v in objective.epoch_metrics().items()}

    def _bootstrap(self) -> dict[str, float]:
        """The plan's bootstrap (FedSEAL): the server objective for its ``bootstrap_epochs``
        before round 1, logged in row 0 as ``bootstrap/*`` with w^0's ``bootstrap_test/acc``."""
        epochs = self.method.round_plan().bootstrap_epochs
        if epochs == 0 or self.data.labels_at == "client":
            return {}
        self.method.on_round_start(0, self.config.rounds)
        trained = self.server_step(0, epochs)
        metrics = {k.replace("server/", "bootstrap/", 1): v for k, v in trained.items()}
        return metrics | self.evaluate("bootstrap_test")

    def evaluate(self, prefix: str = "test") -> dict[str, float]:
        """Top-1 accuracy and loss of the method's evaluation network on the test set, its
        BatchNorm statistics re-estimated on the server's clean images (:func:`scored`); with
        ``prefix`` "test", also on the server's validation split (``val/acc``, ``val/loss``)
        where it has images (``data.val_per_class``): what a model is selected by."""
        seed_all(derive_seed(self.seed, 0, EVAL))
        network = scored(self.method.eval_network(), self.data, self.trainer.device())
        evaluator = Evaluator(network, self.data.num_classes)
        self.trainer.test(evaluator, self.data.test_dataloader())
        metrics = evaluator.metrics(prefix)
        if prefix == "test" and len(self.data.val):
            validation = Evaluator(network, self.data.num_classes)
            self.trainer.test(validation, self.data.val_dataloader())
            metrics |= validation.metrics("val")
        return metrics

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
        self.store.checkpointed()  # the files the checkpoint no longer names go
        self.checkpointed_round = round_idx
