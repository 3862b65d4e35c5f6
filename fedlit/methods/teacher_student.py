"""The teacher-student EMA family of paper 003: TS-Server EMA, TS-Client EMA and FedSwitch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities import CombinedLoader

from fedlit.aggregation import Aggregated, Mean, weighted_average
from fedlit.aggregation.payloads import StateDict, detached_copy, state_part
from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.loaders import ImageBatches
from fedlit.data.pool import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload, seed_classifier
from fedlit.methods.client_side import ClientSetup, ClientSide, ClientUpdate
from fedlit.methods.plan import SERVER_LAST, RoundPlan
from fedlit.models import Architecture
from fedlit.objectives import (
    Objective,
    Optimization,
    TeacherStudentClient,
    TeacherStudentLoss,
    ramped_decay,
)
from fedlit.search_space import CLIENT_SPACE, log_uniform, uniform

TEACHER = "teacher"  # the payload / upload part of the teacher's weights
#: FedSwitch's upload part of a client's eq 2 measures: its mean D_KL^T (``"teacher"``, when it
#: had a teacher) and D_KL^S (``"student"``), float64 scalars
KL_REPORT = "kl"


class TeacherStudentClientSide(ClientSide):
    """A teacher-student client: the student trained on the teacher's pseudo-labels (weak
    view -> strong view), with CE on its own labels where it has them
    (:class:`~fedlit.objectives.TeacherStudentClient`); the student alone where the payload
    carries no teacher.

    Args:
        loss: lambda_u, tau and mu (:class:`~fedlit.objectives.TeacherStudentLoss`).
        teacher_ema: the per-batch EMA decay of the local teacher; None: the teacher stays.
        upload_teacher: the local teacher is uploaded with the student.
        The others: see :class:`~fedlit.methods.client_side.ClientSide`.
    """

    def __init__(
        self,
        setup: ClientSetup,
        loss: TeacherStudentLoss,
        teacher_ema: float | None,
        upload_teacher: bool,
    ) -> None:
        super().__init__(setup, ("weak", "strong"))
        self.loss, self.teacher_ema, self.upload_teacher = loss, teacher_ema, upload_teacher

    def loader(self, client: ClientData) -> ImageBatches | CombinedLoader:
        unlabeled = client.dataloader(self.views)
        if client.labeled is None:
            return unlabeled
        labeled = client.labeled_dataloader(("weak",))
        return CombinedLoader({"unlabeled": unlabeled, "labeled": labeled}, "max_size_cycle")

    def objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        teacher = state_part(payload, TEACHER) if TEACHER in payload else None
        return TeacherStudentClient(
            self.model(payload),
            teacher=self.network(teacher, TEACHER) if teacher is not None else None,
            num_classes=self.architecture.num_classes,
            teacher_ema=self.teacher_ema,
            loss=self.loss,
            **self.optimizer_kwargs(),
        )

    def upload(self, objective: Objective) -> Payload:
        upload = super().upload(objective)
        if self.upload_teacher:
            upload[TEACHER] = detached_copy(objective.teacher)  # type: ignore[arg-type]
        return upload


class TeacherStudentEMA(FederatedMethod):
    """The shared shape of paper 003's teacher-student methods (Algorithms 1 and 2).

    The global student S (``self.network``) and the global teacher T (``self.teacher``, server
    state). Clients train the student with lambda_u x FixMatch's unlabeled loss on pseudo-labels
    from the teacher (weak view -> strong view) plus FedProx's (mu / 2)||S - S_global||^2, and,
    with ``data.labels_at: client`` (Algorithm 1), CE on their own labels; the server averages
    the students (plain mean, as in the algorithms), trains the result on its labels (Algorithm
    2; skipped with labels at the clients) and then takes the teacher's EMA step
    T <- a T + (1 - a) S (eq 1) with Mean Teacher's ramp-up a_t = min(1 - 1/(t + 1), ema_decay),
    t counting rounds, so the first teacher is the first trained student. The per-round
    ``test/acc`` is the student's.

    Subclasses say whether the teacher is sent (``send_teacher``), adapted on the client by an
    EMA after every batch (``local_teacher_adaptation``) and uploaded (``upload_teacher``).

    Args:
        loss: the clients' lambda_u (weight of the unlabeled loss), tau (FixMatch's confidence
            threshold) and mu (FedProx) (:class:`~fedlit.objectives.TeacherStudentLoss`).
        ema_decay: the server's EMA decay a per round (after the ramp-up).
        client_ema_decay: the per-batch EMA decay of a client's local teacher.
        The others: see :class:`FederatedMethod`.
    """

    #: paper 003's lambda_u (1) and tau (0.95), and the teacher's EMA rates (0.9, 0.99).
    search_space = {
        **CLIENT_SPACE,
        "model.init_args.loss.lambda_u": log_uniform(0.25, 4.0),
        "model.init_args.loss.tau": uniform(0.7, 0.99),
        "model.init_args.ema_decay": uniform(0.5, 0.99),
        "model.init_args.client_ema_decay": uniform(0.9, 0.999),
    }

    supports_labels_at_client = True
    local_teacher_adaptation: ClassVar[bool] = False
    upload_teacher: ClassVar[bool] = False
    #: The clients' side, built from ``loss`` and the flags above (FedSwitch's also reports eq 2).
    client_side_class: ClassVar[type[TeacherStudentClientSide]] = TeacherStudentClientSide

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: TeacherStudentLoss = TeacherStudentLoss(),
        ema_decay: float = 0.9,
        client_ema_decay: float = 0.99,
    ) -> None:
        for key, value in (("ema_decay", ema_decay), ("client_ema_decay", client_ema_decay)):
            if not 0 <= value <= 1:
                raise ValueError(f"model.{key} must be in [0, 1], got {value}")
        super().__init__(network, optim)
        self.loss = loss
        self.ema_decay, self.client_ema_decay = ema_decay, client_ema_decay
        self.aggregator = Mean()  # the plain mean, as in the algorithms
        self.teacher = self._new_network()
        self.teacher_steps: torch.Tensor
        self.register_buffer("teacher_steps", torch.tensor(0))  # EMA steps taken (ramp-up)

    def round_plan(self) -> RoundPlan:
        return SERVER_LAST

    def initialize(self) -> None:
        super().initialize()
        self.teacher.load_state_dict(self.network.state_dict())  # T_0 = S_0
        self.teacher_steps.zero_()

    def warm_start(self, network: StateDict, data: FederatedDataModule) -> None:
        """The student and the teacher both take the source's network (T_0 = S_0, as at a
        fresh start); the teacher's EMA ramp-up starts from its first step."""
        seed_classifier(self.network, network)
        self.teacher.load_state_dict(self.network.state_dict())
        self.teacher_steps.zero_()

    # --- what travels ---------------------------------------------------------------------
    def send_teacher(self) -> bool:
        """Whether this round's sampled clients receive the teacher."""
        return True

    def broadcast(self) -> Payload:
        payload = super().broadcast()
        if self.send_teacher():
            teacher = self.teacher.state_dict()
            payload[TEACHER] = {k: v.detach().clone() for k, v in teacher.items()}
        return payload

    # --- client ---------------------------------------------------------------------------
    def client_side(self) -> TeacherStudentClientSide:
        return self.client_side_class(
            self._client_setup(),
            loss=self.loss,
            teacher_ema=self.client_ema_decay if self.local_teacher_adaptation else None,
            upload_teacher=self.upload_teacher,
        )

    # --- server ---------------------------------------------------------------------------
    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """S = the plain mean of the students; with uploaded teachers, T = their mean."""
        counts = [u.num_examples for u in updates]
        result = self.aggregator([u.model for u in updates], counts)
        self.network.load_state_dict(result.state, strict=False)
        if self.upload_teacher:
            teachers = [state_part(u.upload, TEACHER) for u in updates]
            self.teacher.load_state_dict(self.aggregator(teachers, counts).state)
        return result

    def end_round(self) -> dict[str, float]:
        """T <- a T + (1 - a) S (paper 003 eq 1), after aggregation and the server's step."""
        decay = ramped_decay(int(self.teacher_steps), self.ema_decay)
        ema = weighted_average(
            [self.teacher.state_dict(), self.network.state_dict()], [decay, 1.0 - decay]
        )
        self.teacher.load_state_dict(ema)
        self.teacher_steps += 1
        return {}


class TSServerEMA(TeacherStudentEMA):
    """TS-Server EMA (paper 003 3.3): clients pseudo-label with their copy of the global
    teacher, which they neither update nor upload; only the teacher's server EMA moves it."""


class TSClientEMA(TeacherStudentEMA):
    """TS-Client EMA (paper 003 3.2): each client's local teacher follows its student by EMA
    after every batch and is uploaded with it; the server averages the teachers too (twice the
    upload of TS-Server EMA), then takes its own EMA step."""

    local_teacher_adaptation = True
    upload_teacher = True


class FedSwitchClientSide(TeacherStudentClientSide):
    """FedSwitch's client: a teacher-student client that also reports eq 2's measures,
    D_KL^T and D_KL^S (the means over its batches, as its metrics ``kl/teacher`` and
    ``kl/student`` log them), as its upload's :data:`KL_REPORT` part; a client without a
    teacher reports no D_KL^T."""

    def upload(self, objective: Objective) -> Payload:
        upload = super().upload(objective)
        measured = objective.epoch_metrics()
        upload[KL_REPORT] = {
            name: torch.tensor(measured[f"kl/{name}"], dtype=torch.float64)
            for name in ("teacher", "student")
            if f"kl/{name}" in measured
        }
        return upload


class FedSwitch(TeacherStudentEMA):
    """FedSwitch (paper 003 section 4): local teacher adaptation without upload, and adaptive
    switching between teacher and student for pseudo-labels.

    Clients adapt their copy of the teacher by EMA after every batch but upload the student
    only. Each client reports D_KL^T (the teacher's predicted-label distribution on weak views
    against the uniform one) and D_KL^S (the student's on strong views), eq 2, as its upload's
    ``kl`` part (:data:`KL_REPORT`, 8 bytes a value, ``comm/bytes_up/kl``); the server
    averages them over the round's clients and sends the teacher next round only if
    |D_KL^T - beta| < |D_KL^S - beta| (eq 3); otherwise it sends the student alone and clients
    pseudo-label with it (FedProx-FixMatch's client). Algorithms 1-2 print the condition the
    other way round; eq 3 and the text agree with each other, and fedlit follows them.

    In rounds without a teacher there is no D_KL^T to measure: the last measured value is
    kept. Round 1 sends the teacher. Logged: ``switch/use_teacher`` (fraction of the round's
    clients that had one), ``kl/teacher``, ``kl/student``.

    Args:
        beta: the IIDness prior, the expected D_KL of the clients' label distributions
            (0 for balanced clients, up to log(L) for single-class clients).
        switching: False sends the teacher every round, eq 3 unapplied (an ablation of the
            switch: local teacher adaptation alone); the KL measures are still logged.
        The others: see :class:`TeacherStudentEMA`.
    """

    local_teacher_adaptation = True
    client_side_class = FedSwitchClientSide

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: TeacherStudentLoss = TeacherStudentLoss(),
        ema_decay: float = 0.9,
        client_ema_decay: float = 0.99,
        beta: float = 0.0,
        switching: bool = True,
    ) -> None:
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"model.beta must be finite and >= 0, got {beta}")
        super().__init__(network, optim, loss, ema_decay, client_ema_decay)
        self.beta, self.switching = beta, switching
        # the last round-mean D_KL^T and D_KL^S (float64, as Python's floats), and whether each
        # has been measured yet
        self.kl: torch.Tensor
        self.kl_measured: torch.Tensor
        self.register_buffer("kl", torch.zeros(2, dtype=torch.float64))
        self.register_buffer("kl_measured", torch.zeros(2, dtype=torch.bool))

    def initialize(self) -> None:
        super().initialize()
        self.kl.zero_()
        self.kl_measured.zero_()

    def send_teacher(self) -> bool:
        if not self.switching or not self.kl_measured.all():
            return True
        beta = self.beta
        kl_teacher, kl_student = self.kl.tolist()
        return abs(kl_teacher - beta) < abs(kl_student - beta)

    def aggregate(self, updates: Sequence[ClientUpdate]) -> Aggregated:
        """The students' mean; the round's mean D_KL^T and D_KL^S from the clients' reports
        (a client without a teacher reports no D_KL^T)."""
        result = super().aggregate(updates)
        reports = [state_part(u.upload, KL_REPORT) for u in updates]
        for i, name in enumerate(("teacher", "student")):
            values = [float(report[name]) for report in reports if name in report]
            if values:
                self.kl[i] = sum(values) / len(values)
                self.kl_measured[i] = True
        return result
