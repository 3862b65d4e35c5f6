"""What happens around the rounds, one callback each: the start-of-run notes, ``run.json``,
the rows of ``metrics.csv`` and the other loggers (W&B), the partition image, the weight
diversity of the updates, checkpoints and progress.

Callbacks observe and never train: each sees the run through :class:`RunView`, a read-only
view. The driver and the round loop (:mod:`fedlit.federation.rounds`) call the one dispatcher,
:class:`Callbacks`, which calls each callback in order; a callback that adds metrics comes
before those that write them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Literal, Protocol

from lightning.pytorch.loggers import Logger, WandbLogger
from torch import Tensor
from tqdm import tqdm  # text, also in notebooks (no widget: no ipywidgets needed)

from fedlit.aggregation import weight_diversity
from fedlit.aggregation.payloads import Payload, flatten_payload
from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.config import FederationConfig
from fedlit.federation.console import note, warn
from fedlit.federation.faults import ROUND_FAILED, ClientFault
from fedlit.federation.fit import TrainerTemplate
from fedlit.federation.loggers import RoundCSVLogger, start_wandb
from fedlit.federation.resume import Checkpointer
from fedlit.federation.warmstart import WarmStart
from fedlit.methods.base import FederatedMethod, marks
from fedlit.methods.client_side import ClientUpdate
from fedlit.reporting.runs import read_run_json
from fedlit.run_layout import BUDGET_KEY, RUN_FILE

#: How a run ended: all rounds done, stopped by a failed round, or stopped otherwise
#: (interrupted, SIGTERM, an error).
Ending = Literal["success", "failed", "stopped"]


class RunView(Protocol):
    """What a callback sees of a run (:class:`~fedlit.federation.driver.Federation` is one),
    read and never changed: what it was given (its method, data, settings, trainer settings,
    directory, seed and loggers), its flat config (``hparams``) and ``progress`` setting; the
    first round this process runs (``start_round``: 1, or the round after a resumed
    checkpoint); each client's number of visits; the metrics of the rounds run so far
    (``history``); its checkpoint, written through ``checkpointer``; and the warm start it
    starts from afresh (``source``, None for a fresh start or a resume); and the server's
    training budget (``server_budget``)."""

    @property
    def method(self) -> FederatedMethod: ...
    @property
    def data(self) -> FederatedDataModule: ...
    @property
    def config(self) -> FederationConfig: ...
    @property
    def trainer(self) -> TrainerTemplate: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def seed(self) -> int: ...
    @property
    def loggers(self) -> Sequence[Logger]: ...
    @property
    def hparams(self) -> dict[str, Any]: ...
    @property
    def progress(self) -> bool | None: ...
    @property
    def start_round(self) -> int: ...
    @property
    def visits(self) -> dict[int, int]: ...
    @property
    def history(self) -> list[dict[str, float]]: ...
    @property
    def checkpoint_path(self) -> Path: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def source(self) -> WarmStart | None: ...
    @property
    def server_budget(self) -> dict[str, Any]: ...


class Callback:
    """A no-op at every point of the run; subclasses override what they need."""

    def on_run_start(self, run: RunView) -> None:
        """The run starts (or resumes): before anything is trained."""

    def on_first_row(self, run: RunView, row0: dict[str, float]) -> None:
        """A run that starts afresh has its round-0 row: the partition summary and the
        bootstrap's metrics."""

    def on_stage(self, run: RunView, round_idx: int, stage: str) -> None:
        """A stage of the round starts: ``server step``, ``client k/C`` (in the driver's
        process; ``C clients`` where they run elsewhere), ``fine-tune``, ``evaluation``."""

    def on_client_fault(self, run: RunView, round_idx: int, fault: ClientFault) -> None:
        """A client left out of its round."""

    def on_updates(
        self,
        run: RunView,
        round_idx: int,
        received: Sequence[Payload],
        updates: Sequence[ClientUpdate],
        metrics: dict[str, float],
    ) -> None:
        """The surviving clients' updates and what each received, before aggregation; may
        add to the round's ``metrics``."""

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        """After the round (its metrics in ``run.history``); may add to ``metrics`` when it
        comes before the callbacks that write them."""

    def on_run_end(self, run: RunView, ending: Ending) -> None:
        """The run ends, however it ends."""


class Callbacks:
    """The run's one dispatcher: each point of the run goes to its callbacks in order, each
    with the run's read-only view ``run``."""

    def __init__(self, callbacks: Sequence[Callback], run: RunView) -> None:
        self.items = list(callbacks)
        self.run = run

    def run_start(self) -> None:
        for cb in self.items:
            cb.on_run_start(self.run)

    def first_row(self, row0: dict[str, float]) -> None:
        for cb in self.items:
            cb.on_first_row(self.run, row0)

    def stage(self, round_idx: int, stage: str) -> None:
        for cb in self.items:
            cb.on_stage(self.run, round_idx, stage)

    def client_fault(self, round_idx: int, fault: ClientFault) -> None:
        for cb in self.items:
            cb.on_client_fault(self.run, round_idx, fault)

    def updates(
        self,
        round_idx: int,
        received: Sequence[Payload],
        updates: Sequence[ClientUpdate],
        metrics: dict[str, float],
    ) -> None:
        for cb in self.items:
            cb.on_updates(self.run, round_idx, received, updates, metrics)

    def round_end(self, round_idx: int, metrics: dict[str, float]) -> None:
        for cb in self.items:
            cb.on_round_end(self.run, round_idx, metrics)

    def run_end(self, ending: Ending) -> None:
        for cb in self.items:
            cb.on_run_end(self.run, ending)


class Announce(Callback):
    """Say what the method is when it is not an ordinary federated semi-supervised method (an
    oracle, the centralized reference, not private), the settings the data set decides
    (:attr:`FederatedDataModule.notes`), that the user's own images are flipped where
    ``data.hflip`` is left to its default, clients that hold fewer images than a batch, and
    each client left out of its round."""

    def on_run_start(self, run: RunView) -> None:
        data = run.data
        for line in data.notes:
            note(line)
        if data.is_users_own and data.hflip is None and data.spec.hflip:
            note(
                "data.hflip: the weak view flips your images left to right (the default for "
                "your own data, as for natural images); set data.hflip=false where a mirror "
                "changes the class (digits, text)"
            )
        name = type(run.method).__name__
        if run.method.oracle:
            note(
                f"{name} is an oracle: its clients train on their true labels (an upper "
                "bound, not a semi-supervised method)"
            )
        if run.method.centralized:
            note(
                f"{name} is the centralized reference: every client's images are trained on at "
                "the server, without federation (a reference, not a federated method)"
            )
        if not run.method.private:
            note(
                f"{name} is not private: it sends clients other clients' models, which "
                "standard federated learning does not allow"
            )
        sizes = [len(c) for c in data.clients] if run.method.round_plan().uses_clients else []
        small = sum(size < data.client_batch_size for size in sizes)
        if small:
            warn(
                f"{small} of {len(sizes)} clients hold fewer images than a batch (the smallest "
                f"{min(sizes)}, data.client_batch_size={data.client_batch_size}): each local "
                "epoch is one short batch; lower data.client_batch_size or data.num_clients"
            )

    def on_client_fault(self, run: RunView, round_idx: int, fault: ClientFault) -> None:
        warn(f"round {round_idx}: {fault.describe()}; left out of the round")


class RunFile(Callback):
    """``run.json``, its one writer: who this run is (its method and seed, and the labels it
    is given, ``federation.labels``: a comparison's method name, setting and recipe), how
    many rounds it is configured for, its marks and, for a warm start, its source
    (``init_from``: path, SHA-256 of the weights, method, round, test accuracy; kept on a
    resume), and the server's training budget (:data:`~fedlit.run_layout.BUDGET_KEY`: the
    record reports read it from, for a run of the CLI and of the Python API alike), so
    reports can read runs without their config."""

    def on_run_start(self, run: RunView) -> None:
        path = run.run_dir / RUN_FILE
        before: dict[str, Any] = {}
        with suppress(ValueError):  # an unreadable record is rewritten
            before = read_run_json(path) if path.is_file() else {}
        info = {"method": type(run.method).__name__, "seed": run.seed} | before
        info |= run.config.labels or {}
        info["rounds"] = run.config.rounds
        info["marks"] = list(marks(type(run.method)))
        if run.source is not None:
            info["init_from"] = run.source.info()
        info[BUDGET_KEY] = run.server_budget
        path.write_text(json.dumps(info))


class WeightDiversity(Callback):
    """``diag/weight_diversity``: the weight diversity of the round's updates (paper 004
    eq 8), each against what its client received."""

    def on_updates(
        self,
        run: RunView,
        round_idx: int,
        received: Sequence[Payload],
        updates: Sequence[ClientUpdate],
        metrics: dict[str, float],
    ) -> None:
        # one payload sent to many clients: flattened once, one state for all of them
        flat: dict[int, dict[str, Tensor]] = {id(p): flatten_payload(p) for p in received}
        start = [flat[id(p)] for p in received]
        metrics["diag/weight_diversity"] = weight_diversity(
            start, [flatten_payload(u.upload) for u in updates]
        )


#: Client metrics that measure how much of a client's unlabeled data its loss used: the
#: confident fraction of pseudo-labelling objectives (FixMatch, UDA, the teacher-student and
#: consistency losses, FedMatch) and FedSEAL's positive and complementary sets.
ACTIVITY_METRICS = ("mask_rate", "pseudo/pos_frac", "pseudo/neg_frac")


def client_contributed(metrics: dict[str, float]) -> bool:
    """Whether a client's unlabeled loss was active in its round: some of its
    :data:`ACTIVITY_METRICS` above 0. A client that reports none of them has an objective
    without a confidence gate (SSL, FedCon, FedSup, the FedAvg-SL oracle), which is always
    active."""
    reported = [metrics[key] for key in ACTIVITY_METRICS if key in metrics]
    return not reported or any(value > 0 for value in reported)


class Contribution(Callback):
    """``client/contributed``: the fraction of the round's aggregated clients whose unlabeled
    loss was active (:func:`client_contributed`: FixMatch's
    ``mask_rate`` above 0, ...), and a warning (stderr, once) in a round where none was: that
    round's clients learned nothing from their unlabeled data, so what the round gains is the
    server's own training."""

    def on_updates(
        self,
        run: RunView,
        round_idx: int,
        received: Sequence[Payload],
        updates: Sequence[ClientUpdate],
        metrics: dict[str, float],
    ) -> None:
        if not updates:
            return
        active = [client_contributed(update.metrics) for update in updates]
        metrics["client/contributed"] = sum(active) / len(active)
        if not any(active):
            keys = [k for k in ACTIVITY_METRICS if k in updates[0].metrics]
            warn(
                f"round {round_idx}: no client's unlabeled loss was active ({', '.join(keys)} "
                f"0 at all {len(updates)} clients: no pseudo-label passed its threshold), so the "
                "clients' unlabeled loss contributed nothing this round"
            )


class Rows(Callback):
    """The rows of ``metrics.csv`` and of the run's other loggers (W&B, its run started with
    :func:`~fedlit.federation.loggers.start_wandb`): the hyperparameters and row 0 at the
    start, one row per round, finalized (and a W&B run finished, so the next run starts its
    own) at the end."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers = list(loggers)

    def on_run_start(self, run: RunView) -> None:
        self.loggers = [RoundCSVLogger(run.run_dir), *self.loggers]
        for logger in self.loggers:
            start_wandb(logger)  # its summaries declared before its first row

    def on_first_row(self, run: RunView, row0: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log_hyperparams(run.hparams)
            logger.log_metrics(row0, step=0)

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=round_idx)
            logger.save()  # on disk before the round's checkpoint

    def on_run_end(self, run: RunView, ending: Ending) -> None:
        if ending == "stopped":
            return
        for logger in self.loggers:
            logger.finalize(ending)
            if isinstance(logger, WandbLogger):
                if ending == "failed":
                    logger.experiment.finish(exit_code=ROUND_FAILED)
                else:
                    logger.experiment.finish()


class PartitionImage(Callback):
    """The clients' class counts as a heat map, for loggers that take images (W&B)."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.imaging = [logger for logger in loggers if hasattr(logger, "log_image")]

    def on_first_row(self, run: RunView, row0: dict[str, float]) -> None:
        if not self.imaging:
            return
        from fedlit.reporting import plot_partition  # matplotlib only when it is needed

        data = run.data
        title = data.partition_title()
        path = plot_partition(
            data.class_counts,
            run.run_dir / "partition.png",
            title,
            data.class_names,
            client_names=data.named_clients(),
        )
        for logger in self.imaging:
            logger.log_image(key="partition", images=[str(path)], step=0)


class Checkpoints(Callback):
    """``checkpoints/last.ckpt`` after every round, written after the round's rows."""

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        run.checkpointer.save(round_idx, run.visits, run.history)


class Progress(Callback):
    """A progress bar on a terminal (``run.progress`` None) or when asked (True): the round,
    the stage within it (server step, client k of C, fine-tune, evaluation), the elapsed time
    and, from the end of the first round on, the estimated time left. Otherwise (None: a log
    file, a notebook) lines: on stderr the set-up's stages (round 0: the data, the bootstrap),
    each round's first stage and a later stage where the last line is :data:`QUIET_S` old; on
    stdout a line per round with its accuracy and the estimate. Nothing when False."""

    #: Seconds without a line after which the next stage of a round gets one (no bar).
    QUIET_S = 10.0

    def __init__(self) -> None:
        self.bar: Any = None
        self.started = 0.0
        self.done = 0  # rounds run by this process
        self.said = (-1, 0.0)  # the round of the last stage line, and when it was printed

    def on_run_start(self, run: RunView) -> None:
        self.started, self.done = time.perf_counter(), 0
        show = sys.stderr.isatty() if run.progress is None else run.progress
        if show:
            self.bar = tqdm(
                total=run.config.rounds,
                initial=run.start_round - 1,
                desc="rounds",
                unit="round",
                dynamic_ncols=True,
                smoothing=0,  # the estimate: the mean round time so far
            )

    def on_stage(self, run: RunView, round_idx: int, stage: str) -> None:
        where = f"round {round_idx}/{run.config.rounds}" if round_idx else "set-up"
        if self.bar is not None:
            self.bar.set_description_str(f"{where}: {stage}")
            return
        now = time.perf_counter()
        if run.progress is False or (
            round_idx and round_idx == self.said[0] and now - self.said[1] < self.QUIET_S
        ):
            return
        self.said = (round_idx, now)
        print(f"{where}: {stage}", file=sys.stderr, flush=True)  # stdout carries the results

    def eta_s(self, run: RunView, round_idx: int) -> float:
        """Seconds left: the rounds left times the mean time of this process's rounds."""
        return (time.perf_counter() - self.started) / self.done * (run.config.rounds - round_idx)

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        self.done += 1
        acc = metrics.get("test/acc")
        text = f"acc {acc:.4f}" if acc is not None else "acc -"
        if self.bar is not None:
            self.bar.set_description_str(f"round {round_idx}/{run.config.rounds}: done")
            self.bar.set_postfix_str(f"{text}, {metrics['time/round_s']:.1f} s/round")
            self.bar.update(1)
        elif run.progress is None:
            seconds = metrics["time/round_s"]
            left = f"  about {_duration(self.eta_s(run, round_idx))} left"
            print(
                f"round {round_idx}/{run.config.rounds}  {text}  {seconds:.1f} s"
                + (left if round_idx < run.config.rounds else ""),
                flush=True,
            )
            self.said = (round_idx, time.perf_counter())

    def on_run_end(self, run: RunView, ending: Ending) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _duration(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def default_callbacks(loggers: Sequence[Logger]) -> list[Callback]:
    """The callbacks of every run, in order: notes, ``run.json``, the weight diversity, the
    clients' contribution, the rows, the partition image, the checkpoint, the progress."""
    return [
        Announce(),
        RunFile(),
        WeightDiversity(),
        Contribution(),
        Rows(loggers),
        PartitionImage(loggers),
        Checkpoints(),
        Progress(),
    ]
