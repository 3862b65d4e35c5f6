"""The federation driver: a run's set-up (checks, data, a resume, a fresh or a warm start) and
the run (bootstrap, rounds, final encoder evaluation) between its callbacks, over its parts:
:mod:`~fedlit.federation.rundir`, :mod:`~fedlit.federation.resume`,
:mod:`~fedlit.federation.server`, :mod:`~fedlit.federation.rounds`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.callbacks import Callback, Callbacks, Ending, default_callbacks
from fedlit.federation.checks import check_fits, checked_trainer, loading_data
from fedlit.federation.client import ClientRunner
from fedlit.federation.config import FederationConfig, FederationResult
from fedlit.federation.executors import ClientExecutor, make_executor
from fedlit.federation.faults import RoundFailed, stop_on_sigterm
from fedlit.federation.resume import Checkpointer, check_may_change, load_resume
from fedlit.federation.rounds import RoundContext, run_round
from fedlit.federation.rundir import RunDirectory
from fedlit.federation.server import Server
from fedlit.federation.settings import recorded_settings
from fedlit.federation.store import CLIENT_DIR, ClientStateStore
from fedlit.federation.fit import TrainerTemplate
from fedlit.federation.warmstart import WarmStart, load_warm_start, start_afresh
from fedlit.methods.base import FederatedMethod
from fedlit.run_layout import MAX_SEED, WARM_START_EVAL

def check_arguments(federation: Federation) -> None:
    """Refuse, naming the argument as ``fedlit fit`` names its key, a :class:`Federation`
    given what it cannot run: an empty ``run_dir`` (once the current directory), a ``seed``
    that is no integer in [0, 2**32 - 1], a ``method``, ``data``, ``config`` or ``trainer``
    of another type, a logger that is not a Lightning ``Logger``."""
    run_dir = federation.run_dir
    if not isinstance(run_dir, (str, Path)) or not str(run_dir).strip():
        raise ValueError(f"run_dir={run_dir!r}: empty; name the run's directory (e.g. runs/<name>)")
    seed = federation.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed!r}: a seed is an integer in [0, {MAX_SEED}]")
    kinds = {
        "method": (FederatedMethod, "a fedlit method, e.g. fedlit.methods.FedAvgFixMatch(...)"),
        "data": (FederatedDataModule, "fedlit.data.FederatedDataModule(...)"),
        "config": (FederationConfig, "fedlit.federation.FederationConfig(...)"),
        "trainer": (TrainerTemplate, "fedlit.federation.fit.TrainerTemplate(...)"),
    }
    for name, (kind, what) in kinds.items():
        value = getattr(federation, name)
        if not isinstance(value, kind):
            raise ValueError(f"{name}={value!r}: give {what}, not a {type(value).__name__}")
    loggers = federation.loggers
    if isinstance(loggers, (str, bytes, Logger)) or not isinstance(loggers, Sequence):
        raise ValueError(f"loggers={loggers!r}: give a list of Lightning loggers")
    for k, logger in enumerate(loggers):
        if not isinstance(logger, Logger):
            raise ValueError(
                f"loggers[{k}]={logger!r}: not a Lightning logger "
                "(e.g. lightning.pytorch.loggers.WandbLogger(...))"
            )


@dataclass
class Federation:
    """Runs ``method`` on ``data`` for ``config.rounds`` rounds.

    Call :meth:`prepare` (loads data, checks every setting, raises ValueError naming the key
    before anything is written or trained), then :meth:`run`. The run directory is locked
    from :meth:`open_run_dir` to the end of :meth:`run`.
    """

    method: FederatedMethod
    data: FederatedDataModule
    config: FederationConfig
    run_dir: Path
    seed: int = 0
    trainer: TrainerTemplate = field(default_factory=TrainerTemplate)
    loggers: Sequence[Logger] = ()
    hparams: dict[str, Any] = field(default_factory=dict)  # {}: read from the objects given
    progress: bool | None = None  # None: a bar on a terminal, plain lines otherwise
    #: Callbacks after :func:`~fedlit.federation.callbacks.default_callbacks` with ``loggers``.
    extra_callbacks: Sequence[Callback] = ()

    def __post_init__(self) -> None:
        check_arguments(self)  # before anything is read or written
        self.run_dir = Path(self.run_dir)
        self.directory = RunDirectory(self.run_dir)
        self.store = ClientStateStore(self.checkpoint_path.parent / CLIENT_DIR)
        self.hparams = self.hparams or recorded_settings(self)
        self.checkpointer = Checkpointer(
            self.checkpoint_path, self.method, self.data, self.store, self.seed, self.hparams
        )
        self.visits: dict[int, int] = {}  # client id -> rounds it has been selected in
        self.history: list[dict[str, float]] = []
        self.start_round, self._prepared = 1, False
        self.source: WarmStart | None = None  # a fresh run's warm start (init_from)
        self._executor: ClientExecutor | None = None
        self.callbacks = Callbacks([*default_callbacks(self.loggers), *self.extra_callbacks], self)

    @property
    def checkpoint_path(self) -> Path:
        return self.directory.checkpoint_path

    @property
    def server_budget(self) -> dict[str, Any]:
        """``run.json``'s server budget (:meth:`~fedlit.federation.server.Server.budget`)."""
        return self.server.budget()

    # --- checks and set-up ---------------------------------------------------------------
    def prepare(self) -> None:
        """Validate everything and load the data; raises ValueError naming the offending key.
        Nothing is written; a run directory another process is writing is refused first."""
        self.directory.reserve()
        try:
            self._prepare(self.config)
        except BaseException:
            self.close()
            raise

    def _prepare(self, cfg: FederationConfig) -> None:
        check_may_change(cfg, self.hparams)
        self.trainer = checked_trainer(self.trainer, self.method, cfg)
        ckpt = load_resume(cfg.resume)
        self.directory.check(cfg.resume)
        if ckpt is not None:  # before the data are loaded
            self.checkpointer.check(ckpt, cfg)
        elif cfg.init_from is not None:  # a resume continues its checkpoint, never the source
            self.source = load_warm_start(cfg.init_from, self.method)
        check_fits(self.method, self.data, cfg)
        self.callbacks.stage(0, f"loading the data ({self.data.dataset}) and partitioning it")
        with loading_data(self.data):
            self.data.setup_federation(self.seed)
        self.method.validate_data(self.data)
        if ckpt is not None:
            self.checkpointer.restore(ckpt, cfg)
            self.visits, self.history = dict(ckpt.visits), list(ckpt.history)
            self.start_round = ckpt.round + 1
        else:
            start_afresh(self.method, self.data, self.seed, self.source)
        self.runner = ClientRunner(
            client=self.method.client_side(), data=self.data, trainer=self.trainer,
            seed=self.seed, total_rounds=cfg.rounds, local_epochs=cfg.local_epochs,
            local_steps=cfg.local_steps,
        )  # fmt: skip
        self.server = Server(
            self.method, self.data, cfg, self.trainer, self.seed, self.checkpoint_path
        )
        self.round_context = RoundContext(
            self.method, cfg, self.data, self.store, self.visits, self.seed,
            self.callbacks, self.server, start_executor=lambda: self.executor,
        )  # fmt: skip
        if cfg.executor == "ray" and self.method.round_plan().uses_clients:
            self._executor = self.executor  # Ray checked now, before anything is written
        self.data.save_statistics()  # beside the user's files, once every check has passed
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

    def open_run_dir(self) -> None:
        """Prepare (if not done), then create, lock and make ready the run directory
        (:meth:`RunDirectory.open <fedlit.federation.rundir.RunDirectory.open>`)."""
        if not self._prepared:
            self.prepare()
        self.directory.open(self.config.resume, self.store, self.start_round)

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

    def close(self) -> None:
        """Stop the executor (Ray's actors, and a local Ray instance the run started) and
        release the run directory's lock: what :meth:`run` does when the run ends, however it
        ends; also for a run refused after :meth:`prepare`. A no-op the second time."""
        executor, self._executor = self._executor, None
        try:
            if executor is not None:
                executor.close()
        finally:
            self.directory.close()

    def _run(self) -> FederationResult:
        self.callbacks.run_start()
        ending: Ending = "stopped"
        try:
            if self.start_round == 1:
                if epochs := self.server.bootstrap_epochs():
                    self.callbacks.stage(0, f"bootstrap before round 1 (bootstrap_epochs={epochs})")
                row0 = {"round": 0, **self.data.partition_summary(), **self.server.bootstrap()}
                if self.source is not None:  # the network it starts from, as scored
                    row0 |= self.server.evaluate(WARM_START_EVAL)
                self.callbacks.first_row(row0)
            for round_idx in range(self.start_round, self.config.rounds + 1):
                self.run_and_record_round(round_idx)
            ending = "success"
        except RoundFailed:
            ending = "failed"
            raise
        finally:
            self.callbacks.run_end(ending)
        return FederationResult(list(self.history), self.run_dir, self.checkpoint_path)

    def run_round(self, round_idx: int) -> dict[str, float]:
        """Round ``round_idx`` (:func:`~fedlit.federation.rounds.run_round`): its metrics."""
        return run_round(self.round_context, round_idx)

    def run_and_record_round(self, round_idx: int) -> dict[str, float]:
        """Round ``round_idx``, after the last one the final encoder evaluation
        (``eval/<protocol>_acc`` in its metrics), then its callbacks (rows, checkpoint,
        progress)."""
        metrics = self.run_round(round_idx)
        if round_idx == self.config.rounds:
            metrics |= self.server.evaluate_encoder()
        self.history.append(metrics)
        self.callbacks.round_end(round_idx, metrics)
        return metrics
