"""Result tables: the rows (:mod:`~fedlit.reporting.rows`) as CSV and as Markdown tables with
their summaries in words. The names of the modules it was split into are re-exported here."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, fields
from pathlib import Path

from fedlit.reporting.groups import ConfigGroup, config_groups, setting_differences, split_settings
from fedlit.reporting.rows import ResultRow, summarize
from fedlit.reporting.scores import ci95, last_k_warning, score, t_quantile
from fedlit.run_layout import FINAL_EVAL_KEYS

__all__ = [
    "FINAL_EVAL_KEYS",
    "PERCENT_FIELDS",
    "REFERENCE_MARKS",
    "ConfigGroup",
    "ResultRow",
    "ci95",
    "config_groups",
    "budget_table",
    "calibration_verdict",
    "headroom_shares",
    "headroom_verdict",
    "last_k_warning",
    "score",
    "setting_differences",
    "split_settings",
    "summarize",
    "summary",
    "t_quantile",
    "to_markdown",
    "write_csv",
]


#: The ResultRow fields in units of the metric (accuracy): written in percent.
PERCENT_FIELDS = frozenset(
    f.name
    for f in fields(ResultRow)
    if f.name.endswith(("_mean", "_std", "_ci95")) and f.name != "bytes_total"
)


def _published(published: Mapping[str, Mapping[str, float]] | None, row: ResultRow) -> float | None:
    """The paper's number (percent) for the row's method and setting, if any."""
    if published is None:
        return None
    return published.get(row.method, {}).get(row.setting)


def write_csv(
    rows: Sequence[ResultRow],
    path: str | Path,
    published: Mapping[str, Mapping[str, float]] | None = None,
) -> Path:
    """Write the rows as CSV, one column per ResultRow field (seeds and rounds
    space-separated), plus ``published`` when given (blank where absent). The accuracy fields
    (means, stds, paired differences and their intervals, scores, final evaluations) are in
    percent, as in the tables, the plots and ``published``, and so is ``client_activity``
    (the clients' confident fraction, as the table and W&B give it); bytes in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [f.name for f in fields(ResultRow)]
    if published is not None:
        header.append("published")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            cells: list[object] = [
                100 * value if name in PERCENT_FIELDS or name == "client_activity" else value
                for name, value in zip(header, astuple(row), strict=False)
            ]
            cells[header.index("seeds")] = " ".join(str(s) for s in row.seeds)
            cells[header.index("rounds")] = " ".join(str(r) for r in row.rounds)
            cells[header.index("marks")] = " ".join(row.marks)
            cells[header.index("flags")] = "; ".join(row.flags)
            if published is not None:
                paper = _published(published, row)
                cells.append("" if paper is None else paper)
            writer.writerow(cells)
    return path


def _pct(mean: float, std: float) -> str:
    """A fraction as percent with 2 decimals, '± std' when the std is defined."""
    if not math.isfinite(mean):
        return "-"
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if math.isfinite(std) else "")


def _rounds(row: ResultRow, target: float | None) -> str:
    """Mean rounds to target with 'k/n' seeds that reached it, or '-' without a target."""
    if target is None:
        return "-"
    mean = f"{row.rounds_to_target:.1f}" if row.reached else "-"
    return f"{mean} ({row.reached}/{len(row.seeds)})"


def _points(row: ResultRow, baseline: str) -> str:
    """The paired difference from the baseline in percentage points: mean ± std, the 95%
    interval, and ``*`` when the interval excludes 0."""
    if row.method == baseline:
        return "baseline"
    if not row.delta_seeds:
        return "-"
    std = f" ± {100 * row.delta_std:.2f}" if math.isfinite(row.delta_std) else ""
    if not has_interval(row):  # fewer than 3 seeds, or a zero spread: no interval, no star
        return f"{100 * row.delta_mean:+.2f}{std}"
    low, high = 100 * (row.delta_mean - row.delta_ci95), 100 * (row.delta_mean + row.delta_ci95)
    star = " *" if _significance(row) else ""
    return f"{100 * row.delta_mean:+.2f}{std} [{low:+.2f}, {high:+.2f}]{star}"


#: The fewest paired seeds whose difference gets an interval, a ``*`` and a side of the
#: baseline (with 2, the t-interval rests on one degree of freedom's spread).
MIN_INTERVAL_SEEDS = 3

#: Said under a table with a row that has no interval (:func:`has_interval`).
NO_INTERVAL = (
    f"no interval, no `*` and no side of the baseline for a row of fewer than "
    f"{MIN_INTERVAL_SEEDS} paired seeds or whose differences are all the same (a zero spread "
    "says nothing of the seed-to-seed noise)"
)


def has_interval(row: ResultRow) -> bool:
    """Whether the row's paired difference has a 95% interval worth stating: at least
    :data:`MIN_INTERVAL_SEEDS` paired seeds and a spread above zero."""
    return (
        row.delta_seeds >= MIN_INTERVAL_SEEDS
        and math.isfinite(row.delta_ci95)
        and row.delta_ci95 > 0
    )


def _significance(row: ResultRow) -> int:
    """+1 / -1 where the paired difference's 95% interval lies above / below 0, else 0 (and
    0 where it has none: :func:`has_interval`)."""
    if not has_interval(row):
        return 0
    if row.delta_mean - row.delta_ci95 > 0:
        return 1
    return -1 if row.delta_mean + row.delta_ci95 < 0 else 0


#: The marks of references rather than methods: the oracle (true labels at the clients) and
#: the centralized reference (every client's images at the server); the summaries give their
#: differences apart from the methods'.
REFERENCE_MARKS = ("oracle", "centralized")


#: The joint centralized reference: FixMatch with every client's images pooled at the server
#: and a batch of the labels in each step (``recipes/centralized_fixmatch_joint.yaml``), what
#: semi-supervised learning itself gives at the protocol's budget (docs/comparing.md, *The
#: calibration verdict*). A table with its row gives each method's gain as a share of its.
HEADROOM_REFERENCE = "centralized_fixmatch_joint"
#: The headroom rule: the joint reference's paired mean at least this many points above the
#: baseline ...
HEADROOM_MEAN = 8.0
#: ... and its paired 95% interval's low end at least this many.
HEADROOM_LOW = 5.0


def _gain(rows: Sequence[ResultRow], found: Callable[[ResultRow], bool]) -> float:
    """The paired mean difference (points) of the first row ``found`` picks, where it is
    positive; NaN otherwise (no row, no pairing, or no gain to share)."""
    for row in rows:
        if found(row) and row.delta_seeds and math.isfinite(row.delta_mean):
            return 100 * row.delta_mean if row.delta_mean > 0 else math.nan
    return math.nan


def headroom_shares(row: ResultRow, rows: Sequence[ResultRow]) -> tuple[float, float]:
    """A row's paired gain over the baseline as a share of the joint centralized reference's
    (:data:`HEADROOM_REFERENCE`) and of the oracle's (the row marked ``oracle``), among one
    setting's ``rows``: (share of the reference's, share of the oracle's), fractions of their
    mean differences; NaN where the row has no paired difference or the reference (the
    oracle) is absent or gains nothing."""
    if not row.delta_seeds or not math.isfinite(row.delta_mean):
        return math.nan, math.nan
    mine = 100 * row.delta_mean
    joint = _gain(rows, lambda r: r.method == HEADROOM_REFERENCE)
    oracle = _gain(rows, lambda r: "oracle" in r.marks)
    return mine / joint, mine / oracle


def _shares(row: ResultRow, rows: Sequence[ResultRow], baseline: str) -> str:
    """The *share of headroom* cell: ``60% / 20%`` (of the joint reference's gain / of the
    oracle's), ``-`` for what is undefined."""
    if row.method == baseline:
        return "-"
    joint, oracle = headroom_shares(row, rows)
    shown = [f"{100 * share:.0f}%" if math.isfinite(share) else "-" for share in (joint, oracle)]
    return "-" if shown == ["-", "-"] else " / ".join(shown)


def summary(
    rows: Sequence[ResultRow],
    baseline: str,
    target: float | None = None,
    calibration: float | None = None,
) -> str:
    """What one setting's rows show against ``baseline``, in words, from the rows alone: the
    baseline's score (mean ± std over seeds) and whether its mean reaches ``target``; each
    reference's (oracle's, centralized reference's) paired difference; with ``calibration``
    (points) the protocol's calibration verdict (:func:`calibration_verdict`, then its rule on
    the semi-supervised headroom, :func:`headroom_verdict`); and which
    methods the 95% interval puts above the baseline, below it, or does not separate from it
    (each group by descending difference)."""
    base = [row for row in rows if row.method == baseline]
    others = sorted(
        (row for row in rows if row.method != baseline and row.delta_seeds),
        key=lambda r: -r.delta_mean,
    )
    lines = []
    if base:
        row = base[0]
        text = (
            f"- {baseline}: {_pct(row.score_mean, row.score_std)} over {_n_seeds(len(row.seeds))}"
        )
        if target is not None and math.isfinite(row.score_mean):
            met = "reaches" if row.score_mean >= target else "does not reach"
            text += f"; its mean {met} {100 * target:g}%"
        if row.flags:
            text += f"; flagged: {'; '.join(row.flags)}"
        lines.append(text + ".")
    for row in others:
        for mark in REFERENCE_MARKS:
            if mark in row.marks:
                lines.append(f"- {row.method} ({mark}) vs {baseline}: {_points(row, baseline)}.")
    if calibration is not None:
        lines.append(f"- {calibration_verdict(rows, calibration)}")
        lines.append(f"- {headroom_verdict(rows)}")
    groups = {1: "above", -1: "below", 0: "not separated from"}
    methods = [row for row in others if not set(REFERENCE_MARKS) & set(row.marks)]
    for sign, words in groups.items():
        names = [
            f"{row.method} ({100 * row.delta_mean:+.2f}"
            + (f"; flagged: {'; '.join(row.flags)})" if row.flags else ")")
            for row in methods
            if has_interval(row) and _significance(row) == sign
        ]
        if names or all(has_interval(row) for row in methods):
            lines.append(f"- {words.capitalize()} {baseline} (paired 95% CI): "
                         + (", ".join(names) if names else "none") + ".")  # fmt: skip
    unsorted = [f"{row.method} ({100 * row.delta_mean:+.2f})" for row in methods
                if not has_interval(row)]  # fmt: skip
    if unsorted or any(not has_interval(row) for row in others):
        if unsorted:
            lines.append(f"- Not sorted against {baseline}: {', '.join(unsorted)}.")
        lines.append(f"- {NO_INTERVAL[0].upper()}{NO_INTERVAL[1:]}.")
    return "\n".join(lines) + "\n"


def calibration_verdict(rows: Sequence[ResultRow], threshold: float) -> str:
    """The calibration verdict of one setting's rows, in words: whether the oracle (the row
    marked ``oracle``: true labels at the clients) is at least ``threshold`` points above the
    baseline, by its paired difference (docs/comparing.md, *The calibration verdict*):
    *calibrated* where its 95% interval's lower bound is at or above the threshold;
    *calibrated on the mean only* where its mean is, but not its lower bound (or it has no
    interval: :func:`has_interval`), and names an interval that includes 0; *not calibrated*
    where its mean is below. Says so where no row is an oracle compared with the baseline."""
    oracles = [row for row in rows if "oracle" in row.marks and row.delta_seeds]
    need = f"the oracle at least {threshold:+g} points above the baseline"
    if not oracles:
        return f"Calibration ({need}): not judged, no oracle row compared with the baseline."
    row = oracles[0]
    mean = 100 * row.delta_mean
    shown = f"{row.method}'s {mean:+.2f}"
    crosses = ""
    if has_interval(row):
        low, high = mean - 100 * row.delta_ci95, mean + 100 * row.delta_ci95
        shown += f" [{low:+.2f}, {high:+.2f}]"
        if low <= 0 <= high:
            crosses = (
                f"; its interval includes 0: from these seeds the oracle is not separated "
                "from the baseline"
            )
    else:
        low = math.nan
    if mean < threshold:
        verdict = (
            f"**not calibrated**: {shown} is below {threshold:+g}. At this budget the clients' "
            "images cannot add what the protocol asks, so no method's row can show it either"
        )
    elif math.isfinite(low) and low >= threshold:
        verdict = f"**calibrated**: {shown}, its whole interval at or above {threshold:+g}"
    elif math.isfinite(low):
        verdict = (
            f"**calibrated on the mean only**: {shown}, the mean at or above {threshold:+g} "
            "but the interval reaching below it"
        )
    else:
        verdict = (
            f"**calibrated on the mean only**: {shown} is at or above {threshold:+g}, from "
            f"{_n_seeds(row.delta_seeds)} (no interval: fewer than {MIN_INTERVAL_SEEDS} "
            "paired seeds, or a zero spread)"
        )
    return f"Calibration ({need}): {verdict}{crosses}."


def headroom_verdict(rows: Sequence[ResultRow]) -> str:
    """The calibration verdict's second rule, on one setting's rows, in words: whether the
    joint centralized reference (:data:`HEADROOM_REFERENCE`: semi-supervised learning on the
    clients' images pooled at the server) is at least :data:`HEADROOM_MEAN` points above the
    baseline with its paired 95% interval's low end at :data:`HEADROOM_LOW` or more
    (docs/comparing.md, *The calibration verdict*): *room to help* where both hold; *room on
    the mean only* where the mean does but not the low end (or one seed gives no interval);
    *no semi-supervised headroom* where the mean is below. Says so where no such row is
    compared with the baseline."""
    need = (
        f"{HEADROOM_REFERENCE} at least {HEADROOM_MEAN:+g} points above the baseline, its "
        f"interval's low end at {HEADROOM_LOW:+g} or more"
    )
    found = [r for r in rows if r.method == HEADROOM_REFERENCE and r.delta_seeds]
    if not found:
        return f"Semi-supervised headroom ({need}): not judged, no {HEADROOM_REFERENCE} row."
    row = found[0]
    mean = 100 * row.delta_mean
    shown = f"{mean:+.2f}"
    low = math.nan
    if math.isfinite(row.delta_ci95) and row.delta_seeds >= 2:
        low = mean - 100 * row.delta_ci95
        shown += f" [{low:+.2f}, {mean + 100 * row.delta_ci95:+.2f}]"
    if mean < HEADROOM_MEAN:
        verdict = (
            f"**no semi-supervised headroom**: {shown} is below {HEADROOM_MEAN:+g}. "
            "Semi-supervised learning itself, every client's image at the server, gains less "
            "than that here, so no federated method's row can show more"
        )
    elif math.isfinite(low) and low >= HEADROOM_LOW:
        verdict = f"**room to help**: {shown}"
    elif math.isfinite(low):
        verdict = f"**room on the mean only**: {shown}, its low end below {HEADROOM_LOW:+g}"
    else:
        verdict = f"**room on the mean only**: {shown}, from one seed (no interval)"
    return f"Semi-supervised headroom ({need}): {verdict}."


def _n_seeds(n: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} seed" + ("s" if n != 1 else "")


def _rounds_ran(row: ResultRow) -> str:
    """The rounds the row's runs ran: ``20``, or ``12-20`` where they differ."""
    if not row.rounds:
        return "-"
    low, high = min(row.rounds), max(row.rounds)
    return f"{low}" if low == high else f"{low}-{high}"


def _seeds(row: ResultRow) -> str:
    """The number of seeds, noting unfinished runs."""
    unfinished = len(row.seeds) - row.finished
    return f"{len(row.seeds)}" + (f" ({unfinished} unfinished)" if unfinished else "")


def to_markdown(
    rows: Sequence[ResultRow],
    target: float | None = None,
    published: Mapping[str, Mapping[str, float]] | None = None,
    baseline: str | None = None,
    calibration: float | None = None,
) -> str:
    """Markdown tables, one per setting (``### <setting>``, settings in first-appearance
    order), rows sorted by score (the mean of the last ``last_k`` values) descending;
    the rounds the runs ran (``12-20`` where they differ); accuracies in percent, MB = 10^6
    bytes.
    ``target`` (a fraction) only labels the rounds-to-target column; pass the one given to
    summarize, and the same ``baseline`` for its column of paired differences (points, with
    their 95% interval, ``*`` where it excludes 0). Where a setting has the joint
    centralized reference (:data:`HEADROOM_REFERENCE`), a column beside the paired one gives
    each row's gain as a share of the reference's and of the oracle's
    (:func:`headroom_shares`). A
    "paper" column is added when ``published`` is given; "finetune" and "linear" columns when
    some row has those final evaluations. With ``baseline``, each table is followed by its
    ``summary`` (with ``calibration``, its calibration verdict). A "flags" column after the
    paired difference (without a baseline, after the final accuracy and its mean of the last
    ``last_k``) says what else could explain a row's result where some row has a flag
    (:func:`~fedlit.reporting.confounds.row_flags`); each table is followed by its rows'
    server budgets and clients' contribution (:func:`budget_table`)."""
    target_label = f"rounds to {100 * target:g}%" if target is not None else "rounds to target"
    last_k = rows[0].last_k if rows else 1
    header = ["method", "seeds", "rounds", "final test/acc"]
    if last_k > 1:
        header.append(f"mean of last {last_k}")
    if baseline is not None:
        header.append(f"vs {baseline} (paired, 95% CI)")
    shares = baseline is not None and any(r.method == HEADROOM_REFERENCE for r in rows)
    if shares:
        header.append(f"share of {HEADROOM_REFERENCE} / oracle gain")
    flagged = any(row.flags for row in rows)
    if flagged:
        header.append("flags")
    header += ["test/acc at best val/acc", target_label, "MB communicated"]
    evals = [
        name
        for name in FINAL_EVAL_KEYS
        if any(math.isfinite(getattr(row, f"{name}_mean")) for row in rows)
    ]
    header += [f"{name} (final eval)" for name in evals]
    if published is not None:
        header.append("paper")
    by_setting: dict[str, list[ResultRow]] = {}
    for row in rows:
        by_setting.setdefault(row.setting, []).append(row)
    blocks = []
    for setting, group in by_setting.items():
        ordered = sorted(
            group, key=lambda r: -r.score_mean if math.isfinite(r.score_mean) else math.inf
        )
        lines = [
            f"### {setting}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] * len(header)) + "|",
        ]
        for row in ordered:
            name = f"{row.method} ({', '.join(row.marks)})" if row.marks else row.method
            cells = [name, _seeds(row), _rounds_ran(row), _pct(row.final_mean, row.final_std)]
            if last_k > 1:
                cells.append(_pct(row.score_mean, row.score_std))
            if baseline is not None:
                cells.append(_points(row, baseline))
            if shares:
                assert baseline is not None
                cells.append(_shares(row, group, baseline))
            if flagged:
                cells.append("; ".join(row.flags) or "-")
            cells += [
                _pct(row.selected_mean, row.selected_std),
                _rounds(row, target),
                f"{row.bytes_total / 1e6:.2f}",
            ]
            cells += [
                _pct(getattr(row, f"{name}_mean"), getattr(row, f"{name}_std")) for name in evals
            ]
            if published is not None:
                paper = _published(published, row)
                cells.append("" if paper is None else f"{paper:.2f}")
            lines.append("| " + " | ".join(cells) + " |")
        if baseline is not None:
            lines += ["", summary(group, baseline, target, calibration).rstrip()]
        budgets = budget_table(ordered)
        if budgets:
            lines += ["", budgets.rstrip()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def budget_table(rows: Sequence[ResultRow]) -> str:
    """The rows' server budgets and clients' contribution as a Markdown table, one line a row:
    the server's epochs over a run (its bootstrap's, then the times it trained in the rounds x
    the epochs each time; "unknown" where a run records none) and optimiser steps, its warm
    start, the rounds in which the clients contributed nothing (``client/contributed`` 0, of
    those that logged it, over all seeds) and the clients' mean confident fraction; empty
    where no run logged a server step, a client round or a warm start."""
    if not any(row.server_stages or row.client_rounds or row.warm_start for row in rows):
        return ""
    lines = [
        "| method | server epochs | server steps | warm start | rounds clients contributed "
        "nothing | clients' confident fraction |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        epochs = f"{row.server_epochs:g}" if math.isfinite(row.server_epochs) else "unknown"
        if row.server_stages and math.isfinite(row.server_epochs):
            each = (row.server_epochs - row.bootstrap_epochs) / row.server_stages
            parts = [f"{row.server_stages:g} x {each:g}"]
            if row.bootstrap_epochs:
                parts.insert(0, f"bootstrap {row.bootstrap_epochs:g}")
            epochs += f" ({' + '.join(parts)})"
        elif row.server_stages:
            epochs += f" ({row.server_stages:g} x unknown)"
        steps = "-" if row.server_steps == 0 else f"{row.server_steps:g}"
        steps = steps if math.isfinite(row.server_steps) else "unknown"
        silent = f"{row.silent_rounds}/{row.client_rounds}" if row.client_rounds else "-"
        active = row.client_activity
        shown = f"{100 * active:.1f}%" if math.isfinite(active) else "-"
        lines.append(
            f"| {row.method} | {epochs} | {steps} | {row.warm_start or '-'} | {silent} | {shown} |"
        )
    return "\n".join(lines) + "\n"
