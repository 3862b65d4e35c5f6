"""What differs between methods besides the method: each run's server training budget
(:class:`ServerBudget`), its clients' contribution (:class:`Contribution`), the flags a row
gets where either could explain its result (:func:`row_flags`), and the settings the recipes
set differently (:func:`differing_settings`).

Everything here is read from what the runs wrote (``metrics.csv``, ``hparams.yaml``,
``run.json``): a server step ran in a round where it logged ``server/*`` (``finetune/*`` for
a second one), a bootstrap where row 0 holds ``bootstrap/*``.
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

#: The config keys :class:`ServerBudget` reads; :func:`differing_settings` leaves them to it.
BUDGET_KEYS = ("federation.server_epochs", "model.init_args.bootstrap_epochs", "data.batch_size")


@dataclass(frozen=True)
class ServerBudget:
    """The server's training over one run.

    Attributes:
        stages: how many times the server trained in the rounds (a round with a server step
            and a fine-tune counts two).
        epochs_per_stage: ``federation.server_epochs`` (0 where the run records no config).
        bootstrap_epochs: the bootstrap's epochs before round 1 (``bootstrap_epochs``, where
            row 0 logged ``bootstrap/*``; 0 without one, as after a warm start).
        batches_per_epoch: the server's labeled batches an epoch (``data/server_labeled``
            images in shuffled batches of ``data.batch_size``, the last partial one dropped,
            one batch for a set smaller than a batch); 0 where not recorded.
        warm_start: the warm start's source (``run.json`` ``init_from``): its method and
            round, "" for none.
        warm_sha256: the SHA-256 of the source's weights, "" for none: what tells two
            sources apart.
    """

    stages: int
    epochs_per_stage: int
    bootstrap_epochs: int
    batches_per_epoch: int
    warm_start: str
    warm_sha256: str

    @property
    def epochs(self) -> int:
        """The server's epochs over the run: the bootstrap's and every stage's."""
        return self.bootstrap_epochs + self.stages * self.epochs_per_stage

    @property
    def steps(self) -> int:
        """The server's optimiser steps over the run (epochs x batches an epoch)."""
        return self.epochs * self.batches_per_epoch

    def describe(self) -> str:
        """``60 epochs (bootstrap 10)``, ``100 epochs``."""
        boot = f" (bootstrap {self.bootstrap_epochs})" if self.bootstrap_epochs else ""
        return f"{self.epochs} epochs{boot}"


def _int(value: object) -> int:
    """A config value as an int (0 for None, a missing or a non-numeric value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value)


def server_budget(run: RunRecord) -> ServerBudget:
    """``run``'s :class:`ServerBudget`, from its logged stages and its config."""
    stages = sum(
        any(key.startswith(stage) for key in row) for row in run.history for stage in SERVER_STAGES
    )
    booted = any(key.startswith("bootstrap/") for key in run.summary)
    labeled = _int(run.summary.get("data/server_labeled"))
    batch = _int(run.config.get("data.batch_size"))
    batches = (labeled // batch if labeled >= batch else int(labeled > 1)) if batch else 0
    source = run.init_from
    warm = f"{source.get('method', '?')} round {source.get('round', '?')}" if source else ""
    return ServerBudget(
        stages=stages,
        epochs_per_stage=_int(run.config.get("federation.server_epochs")),
        bootstrap_epochs=_int(run.config.get("model.init_args.bootstrap_epochs")) if booted else 0,
        batches_per_epoch=batches,
        warm_start=warm,
        warm_sha256=str(source.get("sha256", "")) if source else "",
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


def _budget_key(budgets: Sequence[ServerBudget]) -> tuple[float, float, tuple[str, ...]]:
    """What two rows' budgets are compared by: their mean epochs and steps, and their
    warm starts' sources (the digests of their weights)."""
    return (
        round(float(np.mean([b.epochs for b in budgets])), 6),
        round(float(np.mean([b.steps for b in budgets])), 6),
        tuple(sorted({b.warm_sha256 for b in budgets})),
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
    of its runs' rounds (``in k/n rounds`` where not in all), and ``server budget: ...``
    where its server's epochs, steps or warm start differ from some other row's, so that the
    server's training alone could explain its difference."""
    flags = []
    rounds, silent = sum(c.rounds for c in clients), sum(c.silent for c in clients)
    if rounds and 2 * silent >= rounds:
        some = "" if silent == rounds else f" in {silent}/{rounds} rounds"
        flags.append(f"clients contributed nothing{some}")
    for theirs in others:
        if theirs and _budget_key(mine) != _budget_key(theirs):
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
