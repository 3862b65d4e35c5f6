"""What differs between methods besides the method: each run's server training budget
(:class:`ServerBudget`), its clients' contribution (:class:`Contribution`), the flags a row
gets where either could explain its result (:func:`row_flags`), and the settings the recipes
set differently (:func:`differing_settings`).

Everything here is read from what the runs wrote (``metrics.csv``, ``run.json``,
``hparams.yaml``): a server step ran in a round where it logged ``server/*`` (``finetune/*``
for a second one), a bootstrap where row 0 holds ``bootstrap/*``; how long each was, from the
budget ``run.json`` records (:data:`~fedlit.run_layout.BUDGET_KEY`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedlit.reporting.groups import short_value, split_settings, under
from fedlit.reporting.runs import RunRecord
from fedlit.run_layout import ACTIVITY_KEYS, CONTRIBUTED, NOT_SETTING_KEYS

#: The logged stages of the server's training each round: the server step and the fine-tune.
SERVER_STAGES = ("server/", "finetune/")

#: The flag of a row some of whose runs record no server budget (written before runs
#: recorded it, without a config): its epochs and steps are unknown, never taken for 0.
UNKNOWN_BUDGET = "server budget unknown: the run records none"

#: The flag of a row that pools warm-started runs (``federation.init_from``) with runs that
#: started afresh: its seeds did not start from one kind of network.
MIXED_WARM_START = "warm and fresh starts pooled"

#: The config keys :class:`ServerBudget` reads; :func:`differing_settings` leaves them to it.
BUDGET_KEYS = ("federation.server_epochs", "model.init_args.bootstrap_epochs", "data.batch_size")


@dataclass(frozen=True)
class ServerBudget:
    """The server's training over one run, as docs/comparing.md defines its budget: every
    epoch of the server's objective on its labels (the bootstrap, the server step and the
    fine-tune of every round); a warm start's source is not counted, it is told apart by the
    digest of its weights.

    Attributes:
        stages: how many times the server trained in the rounds (a round with a server step
            and a fine-tune counts two), from ``metrics.csv``.
        epochs_per_stage: the epochs each time (the run's record, ``run.json``
            :data:`~fedlit.run_layout.BUDGET_KEY`, else its config's
            ``federation.server_epochs``); None where the run records neither.
        bootstrap_epochs: the bootstrap's epochs before round 1 (where row 0 logged
            ``bootstrap/*``; 0 without one, as after a warm start); None where unrecorded.
        batches_per_epoch: the server's labeled batches an epoch (the record's, else
            ``data/server_labeled`` images in shuffled batches of ``data.batch_size``, the
            last partial one dropped, one batch for a set smaller than a batch); None where
            not recorded.
        warm_start: the warm start's source (``run.json`` ``init_from``): its method and
            round, "" for none.
        warm_sha256: the SHA-256 of the source's weights, "" for none: what tells two
            sources apart.
        recorded: where the budget was read: ``"run.json"``, ``"config"``, or ``""`` (the
            run records none).
    """

    stages: int
    epochs_per_stage: int | None
    bootstrap_epochs: int | None
    batches_per_epoch: int | None
    warm_start: str
    warm_sha256: str
    recorded: str = "run.json"

    @property
    def known(self) -> bool:
        """Whether the run's epochs are known (recorded, or nothing trained)."""
        return math.isfinite(self.epochs)

    @property
    def epochs(self) -> float:
        """The server's epochs over the run: the bootstrap's and every stage's (NaN where
        the run trained and records not how much)."""
        boot = self.bootstrap_epochs
        if boot is None or (self.stages and self.epochs_per_stage is None):
            return math.nan
        return float(boot + self.stages * (self.epochs_per_stage or 0))

    @property
    def steps(self) -> float:
        """The server's optimiser steps over the run (epochs x batches an epoch; NaN where
        either is unknown)."""
        if self.batches_per_epoch is None:
            return math.nan if self.epochs != 0 else 0.0
        return self.epochs * self.batches_per_epoch

    def describe(self) -> str:
        """``60 epochs (bootstrap 10)``, ``100 epochs``, ``unknown epochs``."""
        if not self.known:
            return "unknown epochs"
        boot = f" (bootstrap {self.bootstrap_epochs})" if self.bootstrap_epochs else ""
        return f"{self.epochs:g} epochs{boot}"


def _int(value: object) -> int | None:
    """A recorded value as an int (None for a missing or a non-numeric value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def server_budget(run: RunRecord) -> ServerBudget:
    """``run``'s :class:`ServerBudget`: its logged stages, and what it recorded of each
    (``run.json``'s budget, else its config; unknown where it has neither)."""
    stages = sum(
        any(key.startswith(stage) for key in row) for row in run.history for stage in SERVER_STAGES
    )
    booted = any(key.startswith("bootstrap/") for key in run.summary)
    record, config = run.budget, run.config
    if record:
        epochs = _int(record.get("epochs_per_step"))
        boot = _int(record.get("bootstrap_epochs"))
        batches = _int(record.get("batches_per_epoch"))
        recorded = "run.json"
    else:  # a run written before runs recorded their budget: its config, where it has one
        epochs = _int(config.get("federation.server_epochs"))
        boot = _int(config.get("model.init_args.bootstrap_epochs"))
        labeled = _int(run.summary.get("data/server_labeled"))
        batch = _int(config.get("data.batch_size"))
        batches = None
        if batch and labeled is not None:
            batches = labeled // batch if labeled >= batch else int(labeled > 1)
        recorded = "config" if epochs is not None else ""
    source = run.init_from
    warm = f"{source.get('method', '?')} round {source.get('round', '?')}" if source else ""
    return ServerBudget(
        stages=stages,
        epochs_per_stage=epochs,
        bootstrap_epochs=(boot if booted else 0),
        batches_per_epoch=batches,
        warm_start=warm,
        warm_sha256=str(source.get("sha256", "")) if source else "",
        recorded=recorded,
    )


@dataclass(frozen=True)
class Contribution:
    """The clients' part in one run.

    Attributes:
        rounds: the rounds that logged ``client/contributed``.
        silent: those in which no client's unlabeled loss was active (``client/contributed``
            0: no pseudo-label passed its threshold).
        activity: the mean over those rounds of the first of
            :data:`~fedlit.run_layout.ACTIVITY_KEYS` the run logged (FixMatch's
            ``client/mask_rate``, FedSEAL's ``pseudo/pos_frac``); NaN where none.
        activity_key: that key ("" where none).
    """

    rounds: int
    silent: int
    activity: float
    activity_key: str


def contribution(run: RunRecord) -> Contribution:
    """``run``'s :class:`Contribution`, from its ``metrics.csv``."""
    _, contributed = run.series(CONTRIBUTED)
    key = next((k for k in ACTIVITY_KEYS if run.series(k)[1].size), "")
    values = run.series(key)[1] if key else np.empty(0)
    return Contribution(
        rounds=int(contributed.size),
        silent=int(np.sum(contributed == 0)),
        activity=float(np.mean(values)) if values.size else math.nan,
        activity_key=key,
    )


def _mean(values: Sequence[float]) -> float | None:
    """The mean, rounded to 6 places; None where some value is unknown (NaN)."""
    mean = float(np.mean(values))
    return round(mean, 6) if math.isfinite(mean) else None


def _budgets_differ(mine: Sequence[ServerBudget], theirs: Sequence[ServerBudget]) -> bool:
    """Whether two rows' budgets differ: their mean epochs, their mean steps (where both
    know them) or their warm starts' sources (the digests of their weights)."""
    steps = _mean([b.steps for b in mine]), _mean([b.steps for b in theirs])
    return (
        _mean([b.epochs for b in mine]) != _mean([b.epochs for b in theirs])
        or (None not in steps and steps[0] != steps[1])
        or {b.warm_sha256 for b in mine} != {b.warm_sha256 for b in theirs}
    )


def row_flags(
    clients: Sequence[Contribution],
    mine: Sequence[ServerBudget],
    others: Sequence[Sequence[ServerBudget]],
) -> tuple[str, ...]:
    """The flags of a row whose runs' clients and server budgets are ``clients`` and ``mine``,
    against ``others`` (the budgets of the baseline's runs it is paired with; without a
    baseline, of the other rows of its setting): ``clients contributed nothing``
    where its clients' unlabeled loss was inactive (``client/contributed`` 0) in at least half
    of its runs' rounds (``in k/n rounds`` where not in all), ``server budget: ...``
    where its server's epochs, steps or warm start differ from some other row's, so that the
    server's training alone could explain its difference, :data:`MIXED_WARM_START` where
    it pools warm-started runs with runs that started afresh, and :data:`UNKNOWN_BUDGET` where
    some of its runs record no budget (a row is never compared by a budget it does not
    know)."""
    flags = []
    rounds, silent = sum(c.rounds for c in clients), sum(c.silent for c in clients)
    if rounds and 2 * silent >= rounds:
        some = "" if silent == rounds else f" in {silent}/{rounds} rounds"
        flags.append(f"clients contributed nothing{some}")
    warm = sum(bool(b.warm_sha256) for b in mine)
    if 0 < warm < len(mine):
        flags.append(f"{MIXED_WARM_START}: {warm}/{len(mine)} runs warm-started")
    unknown = [b for b in mine if not b.known]
    if unknown:
        some = "" if len(unknown) == len(mine) else f" in {len(unknown)}/{len(mine)} runs"
        flags.append(f"{UNKNOWN_BUDGET}{some}")
        return tuple(flags)
    for theirs in others:
        if theirs and all(b.known for b in theirs) and _budgets_differ(mine, theirs):
            what = f"{mine[0].describe()} vs {theirs[0].describe()}"
            if {b.warm_sha256 for b in mine} != {b.warm_sha256 for b in theirs}:
                what += ", another warm start"
            flags.append(f"server budget: {what}")
            break
    return tuple(flags)


def differing_settings(runs: Sequence[RunRecord]) -> str:
    """The settings the rows of one setting set differently, as Markdown tables (one a
    setting that has any): each flat-config key (besides what is no setting, the method's
    class and what :class:`ServerBudget` reports) whose value differs between the rows, or
    that only some rows have (a method's own settings), with each row's value (``-``: the row
    has no such setting; ``varies``: its runs differ). Empty where the rows agree."""
    by_setting: dict[str, dict[str, list[RunRecord]]] = {}
    for run in split_settings(runs):
        by_setting.setdefault(run.setting, {}).setdefault(run.method, []).append(run)
    blocks = []
    for setting, rows in by_setting.items():
        if len(rows) < 2:
            continue
        values: dict[str, dict[str, str]] = {}
        for method, group in rows.items():
            for key in {k for run in group for k in run.config}:
                seen = {repr(run.config.get(key)) for run in group}
                shown = f"`{short_value(seen.pop())}`" if len(seen) == 1 else "varies"
                values.setdefault(key, {})[method] = shown
        skip = (*NOT_SETTING_KEYS, "model.class_path", *BUDGET_KEYS)
        keys = [
            key
            for key in sorted(values)
            if not under(key, skip)
            and (len(values[key]) < len(rows) or len(set(values[key].values())) > 1)
        ]
        if not keys:
            continue
        shared = [k for k in keys if len(values[k]) == len(rows)]  # the same key, other values
        own = [k for k in keys if k not in shared]
        lines = [
            f"### Settings that differ: {setting}",
            "",
            "| setting | " + " | ".join(rows) + " |",
            "|---|" + "---|" * len(rows),
        ]
        for key in shared + own:
            cells = [values[key].get(method, "-") for method in rows]
            lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return ("\n\n" + "\n\n".join(blocks) + "\n") if blocks else ""
