"""Result tables: runs grouped by (setting, method) and config into mean ± std over seeds."""

from __future__ import annotations

import ast
import csv
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, fields, replace
from pathlib import Path

import numpy as np
from scipy import stats

from fedlit.reporting.runs import RunRecord
from fedlit.run_layout import BYTES_KEYS, FINAL_EVAL_KEYS, NOT_SETTING_KEYS, VAL_ACC


@dataclass(frozen=True)
class ResultRow:
    """One method in one setting, aggregated over its seeds.

    Attributes:
        method, setting: the group: the method, and the setting with the values that tell
            its config group apart where the setting's runs differ (:func:`config_groups`).
        seeds: the runs' seeds, in run order.
        rounds: the rounds each run ran (its last logged round), in run order.
        final_mean, final_std: the metric at each run's last logged value (the last round for a
            finished run); std is the sample std (ddof=1), NaN with one seed.
        selected_mean, selected_std: each run's metric at the round its validation accuracy
            (``val/acc``, the server's validation split) was highest, the first such round
            on a tie: the model selection a run may make without the test set; NaN for runs
            that logged no ``val/acc``.
        rounds_to_target: mean over the seeds that reached ``target`` of the first round with
            metric >= target; NaN if none reached it or there is no target.
        reached: how many seeds reached the target (0 without a target).
        bytes_total: mean over seeds of the sum over rounds of comm/bytes_down + comm/bytes_up.
        finished: how many of the runs are finished.
        delta_mean, delta_std: the paired difference from the baseline method: per seed, this
            run's score (the mean of its last ``last_k`` logged values) minus the baseline's run
            of the same setting, config group and seed (the same labeled set and partition);
            mean and sample std over those seeds; NaN without a baseline.
        delta_seeds: how many seeds the difference is over (0 without a baseline).
        delta_ci95: the half-width of the difference's two-sided 95% confidence interval,
            t_{0.975, n-1} * std / sqrt(n) over the n paired seeds (NaN for n < 2).
        last_k: how many last logged values each run's score averages.
        score_mean, score_std: the score (the mean of each run's last ``last_k`` values) over
            seeds; with ``last_k=1`` the final value.
        finetune_mean, finetune_std, linear_mean, linear_std: ``eval/finetune_acc`` and
            ``eval/linear_acc`` (the driver's ``federation.final_eval`` of the global encoder
            after the last round) over seeds; NaN where not logged.
        marks: what the table writes beside the method (``oracle``), from its runs.
    """

    method: str
    setting: str
    seeds: tuple[int, ...]
    rounds: tuple[int, ...]
    final_mean: float
    final_std: float
    selected_mean: float
    selected_std: float
    rounds_to_target: float
    reached: int
    bytes_total: float
    finished: int
    delta_mean: float = math.nan
    delta_std: float = math.nan
    delta_seeds: int = 0
    delta_ci95: float = math.nan
    last_k: int = 1
    score_mean: float = math.nan
    score_std: float = math.nan
    finetune_mean: float = math.nan
    finetune_std: float = math.nan
    linear_mean: float = math.nan
    linear_std: float = math.nan
    marks: tuple[str, ...] = ()


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std with ddof=1) of the finite values; NaN where undefined."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    mean = float(np.mean(finite)) if finite.size else math.nan
    std = float(np.std(finite, ddof=1)) if finite.size >= 2 else math.nan
    return mean, std


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Student's t quantile of a two-sided ``confidence`` interval (0.95: the 0.975 quantile)
    with ``df`` degrees of freedom (NaN for ``df < 1``)."""
    if df < 1:
        return math.nan
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def ci95(values: Sequence[float], confidence: float = 0.95) -> float:
    """The half-width of the two-sided t-interval of the mean of ``values`` (95%, or
    ``confidence``); NaN for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return math.nan
    return t_quantile(n - 1, confidence) * float(np.std(values, ddof=1)) / math.sqrt(n)


def _first_round_at(run: RunRecord, metric: str, target: float) -> int | None:
    """The first round where ``metric`` >= ``target``, or None if it never gets there."""
    rounds, values = run.series(metric)
    hits = np.flatnonzero(values >= target)
    return int(rounds[hits[0]]) if hits.size else None


def _selected(run: RunRecord, metric: str) -> float:
    """``metric`` at the round of the run's highest ``val/acc`` (the first on a tie; NaN
    without ``val/acc`` or without ``metric`` in that round)."""
    rows = [row for row in run.history if VAL_ACC in row]
    if not rows:
        return math.nan
    best = max(range(len(rows)), key=lambda i: (rows[i][VAL_ACC], -i))
    return rows[best].get(metric, math.nan)


def _bytes_total(run: RunRecord) -> float:
    """Bytes sent down plus up, summed over every logged round."""
    return float(sum(row.get(key, 0.0) for row in run.history for key in BYTES_KEYS))


def _final(run: RunRecord, metric: str) -> float:
    """The run's last logged value of ``metric`` (NaN if it never logged it)."""
    _, values = run.series(metric)
    return float(values[-1]) if values.size else math.nan


def score(run: RunRecord, metric: str, last_k: int) -> float:
    """The mean of the run's last ``last_k`` logged values of ``metric`` (fewer if it logged
    fewer; NaN if none)."""
    _, values = run.series(metric)
    return float(np.mean(values[-last_k:])) if values.size else math.nan


def last_k_warning(
    runs: Sequence[RunRecord], last_k: int, key: str = "last_k", metric: str = "test/acc"
) -> str | None:
    """A line saying which runs logged ``metric`` in fewer than ``last_k`` rounds (their score
    is then the mean of all those rounds), or None."""
    short = [(run, run.series(metric)[1].size) for run in runs]
    short = [(run, n) for run, n in short if n < last_k]
    if not short:
        return None
    run, n = short[0]
    others = f" and {len(short) - 1} other run(s)" if len(short) > 1 else ""
    return (
        f"{key}={last_k} exceeds the {n} round(s) in which {run.run_dir}{others} logged "
        f"{metric}; such a run's score is the mean of all its rounds"
    )


def _summarize_group(
    runs: Sequence[RunRecord],
    target: float | None,
    metric: str,
    baseline: Mapping[int, float] | None = None,
    last_k: int = 1,
    setting: str | None = None,
) -> ResultRow:
    """One ResultRow from the runs of one row (:func:`summarize`); ``baseline``: seed -> the
    baseline method's score in the same setting; ``setting``: the row's label (None: the
    runs' setting)."""
    finals, scores, selected, hits, deltas = [], [], [], [], []
    for run in runs:
        finals.append(_final(run, metric))
        scores.append(score(run, metric, last_k))
        selected.append(_selected(run, metric))
        if target is not None:
            hit = _first_round_at(run, metric, target)
            if hit is not None:
                hits.append(hit)
        if baseline is not None and run.seed in baseline:
            delta = scores[-1] - baseline[run.seed]
            if math.isfinite(delta):
                deltas.append(delta)
    final_mean, final_std = _mean_std(finals)
    selected_mean, selected_std = _mean_std(selected)
    delta_mean, delta_std = _mean_std(deltas)
    score_mean, score_std = _mean_std(scores)
    finetune = _mean_std([_final(run, FINAL_EVAL_KEYS["finetune"]) for run in runs])
    linear = _mean_std([_final(run, FINAL_EVAL_KEYS["linear"]) for run in runs])
    return ResultRow(
        method=runs[0].method,
        marks=runs[0].marks,
        setting=runs[0].setting if setting is None else setting,
        seeds=tuple(run.seed for run in runs),
        rounds=tuple(run.last_round for run in runs),
        final_mean=final_mean,
        final_std=final_std,
        selected_mean=selected_mean,
        selected_std=selected_std,
        rounds_to_target=float(np.mean(hits)) if hits else math.nan,
        reached=len(hits),
        bytes_total=float(np.mean([_bytes_total(run) for run in runs])),
        finished=sum(run.finished for run in runs),
        delta_mean=delta_mean,
        delta_std=delta_std,
        delta_seeds=len(deltas),
        delta_ci95=ci95(deltas),
        last_k=last_k,
        score_mean=score_mean,
        score_std=score_std,
        finetune_mean=finetune[0],
        finetune_std=finetune[1],
        linear_mean=linear[0],
        linear_std=linear[1],
    )


def setting_differences(runs: Sequence[RunRecord]) -> dict[str, list[tuple[object, Path]]]:
    """The flat-config keys in which ``runs`` differ, other than the seed, the run directory
    and display settings (:data:`~fedlit.run_layout.NOT_SETTING_KEYS`): key -> (value, run
    directory) for each run that has the key. Keys some runs lack are not compared."""
    keys = sorted({key for run in runs for key in run.config})
    out: dict[str, list[tuple[object, Path]]] = {}
    for key in keys:
        if any(key == free or key.startswith(free + ".") for free in NOT_SETTING_KEYS):
            continue
        values = [(run.config[key], run.run_dir) for run in runs if key in run.config]
        if len({repr(value) for value, _ in values}) > 1:
            out[key] = values
    return out


#: A class path as a value: its class's name is what a label writes.
_CLASS_PATH = re.compile(r"(?:[A-Za-z_]\w*\.)+([A-Z]\w*)")


def _short_key(key: str) -> str:
    """A flat-config key as a row's label writes it: without ``model.init_args.`` (the
    method's own arguments), the other ``init_args`` parts and a last ``.class_path``
    (``model.init_args.network.backbone`` -> ``network.backbone``)."""
    return (
        key.removeprefix("model.init_args.").replace(".init_args.", ".").removesuffix(".class_path")
    )


def _short_value(value: str) -> str:
    """A value (its ``repr``) as a row's label writes it: a class path as its class's name,
    a string without quotes."""
    try:
        plain = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    if isinstance(plain, str):
        match = _CLASS_PATH.fullmatch(plain)
        return match.group(1) if match else plain
    return str(plain)


@dataclass(frozen=True)
class ConfigGroup:
    """Where a run's row is: its setting, and its values of the keys that split the setting.

    Attributes:
        label: the row's setting as tables write it: the setting, then the run's values of
            the keys that split it, shortly (``iid [data.dataset=folder,
            network.backbone=resnet18]``); the setting alone where its runs agree.
        values: (key, the ``repr`` of the run's value) for each key that splits its setting
            and that the run has, or that the runs of its method that have it agree on.
    """

    label: str
    values: tuple[tuple[str, str], ...]


def _splitting_values(runs: Sequence[RunRecord]) -> dict[int, tuple[tuple[str, str], ...]]:
    """id(run) -> its (key, ``repr`` of value) pairs for the keys that split the setting of
    ``runs`` (one setting's runs): those in which the runs of some method differ. A run that
    lacks such a key takes the value its method's runs that have it agree on, if they do."""
    by_method: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_method.setdefault(run.method, []).append(run)
    keys = sorted({key for group in by_method.values() for key in setting_differences(group)})
    values: dict[int, tuple[tuple[str, str], ...]] = {}
    for group in by_method.values():
        agreed = {}
        for key in keys:
            seen = {repr(run.config[key]) for run in group if key in run.config}
            if len(seen) == 1:
                agreed[key] = seen.pop()
        for run in group:
            values[id(run)] = tuple(
                (key, repr(run.config[key]) if key in run.config else agreed[key])
                for key in keys
                if key in run.config or key in agreed
            )
    return values


def _label(setting: str, pairs: Sequence[tuple[str, str]], short: Mapping[str, str] | None) -> str:
    """A row's setting as tables write it: ``setting [key=value, ...]``, the keys as
    ``short`` names them and the values shortly (:func:`_short_value`), or with ``short``
    None the full keys and values; the setting alone without pairs."""
    if not pairs:
        return setting
    shown = [
        f"{key}={value}" if short is None else f"{short[key]}={_short_value(value)}"
        for key, value in pairs
    ]
    return f"{setting} [{', '.join(shown)}]"


def config_groups(runs: Sequence[RunRecord]) -> list[ConfigGroup]:
    """Each run's ConfigGroup, in the order of ``runs``: the runs of one (setting, method)
    whose flat configs differ in more than the seed (:func:`setting_differences`) are not
    seeds of one row. The keys that split a setting are those in which the runs of some
    method of it differ; every run of the setting is labelled by its values of them, so that
    the rows of one data set or network share a table. A run that lacks such a key takes
    the value the other runs of its method agree on, if they do.

    A label writes keys without ``model.init_args.`` (:func:`_short_key`), class paths as
    their class's name and strings without quotes, or, where that would make two rows of a
    method one, the full keys and values (``repr``)."""
    by_setting: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run)
    out: dict[int, ConfigGroup] = {}
    for setting, setting_runs in by_setting.items():
        values = _splitting_values(setting_runs)
        keys = {key for pairs in values.values() for key, _ in pairs}
        short = {key: _short_key(key) for key in keys}
        rows: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        for run in setting_runs:
            rows.setdefault(run.method, set()).add(values[id(run)])
        # the short form, unless two keys or two rows of a method would read as one
        full = len(set(short.values())) < len(keys) or any(
            len({_label(setting, pairs, short) for pairs in method_rows}) < len(method_rows)
            for method_rows in rows.values()
        )
        for run in setting_runs:
            pairs = values[id(run)]
            out[id(run)] = ConfigGroup(_label(setting, pairs, None if full else short), pairs)
    return [out[id(run)] for run in runs]


def split_settings(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs, each with its row's label (:func:`config_groups`) as its setting: what the
    plots group by, as the tables do."""
    return [
        replace(run, setting=group.label)
        for run, group in zip(runs, config_groups(runs), strict=True)
    ]


def _matches(row: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """Whether two runs' splitting values agree on every key both have."""
    return all(other[key] == value for key, value in row.items() if key in other)


def summarize(
    runs: Sequence[RunRecord],
    target: float | None = None,
    metric: str = "test/acc",
    baseline: str | None = None,
    last_k: int = 1,
) -> list[ResultRow]:
    """One ResultRow per (setting, method) and config group, in first-appearance order of
    ``runs``.

    Runs of one (setting, method) are pooled as seeds where their flat configs agree in
    everything but the seed and what is no setting
    (:data:`~fedlit.run_layout.NOT_SETTING_KEYS`); runs that differ (another data set,
    network, ...) are rows of their own, whose setting is labelled by the values they differ
    in (:func:`config_groups`).

    A run's score is the mean of its last ``last_k`` logged values of ``metric`` (its final
    value for 1): less of one round's noise than the last value alone.

    ``target`` is in the metric's units (a fraction for test/acc). A run that never logs the
    metric counts as a seed but not towards the means. ``baseline`` names the method every
    row is compared with, seed by seed (``delta_*``): a row's run against the baseline's run
    of the same setting and seed whose splitting values agree with the row's on every key
    both have (a seed where none or several do is not paired). Raises ValueError naming both
    run directories if two runs of one row share a seed, as they would be counted twice,
    and naming ``baseline`` if no run is of that method.
    """
    rows: dict[tuple[str, str, str], list[RunRecord]] = {}
    where: dict[tuple[str, str, str], dict[str, str]] = {}
    seen: dict[tuple[str, str, str, int], RunRecord] = {}
    for run, group in zip(runs, config_groups(runs), strict=True):
        key = (run.setting, run.method, group.label)
        ident = (*key, run.seed)
        if ident in seen:
            raise ValueError(
                f"runs {seen[ident].run_dir} and {run.run_dir} are both "
                f"setting={run.setting!r}, method={run.method!r}, seed={run.seed}, and their "
                "configs agree: the seed would be counted twice"
            )
        seen[ident] = run
        rows.setdefault(key, []).append(run)
        where[key] = dict(group.values)
    if isinstance(last_k, bool) or not isinstance(last_k, int) or last_k < 1:
        raise ValueError(f"last_k must be a positive integer, got {last_k!r}")
    if baseline is not None and baseline not in {method for _, method, _ in rows}:
        methods = sorted({method for _, method, _ in rows})
        raise ValueError(f"baseline: no run of method {baseline!r} (methods: {methods})")

    def reference(setting: str, values: Mapping[str, str]) -> dict[int, float] | None:
        """Seed -> the score of the baseline's one run that pairs with a row's of that seed."""
        if baseline is None:
            return None
        by_seed: dict[int, list[RunRecord]] = {}
        for key, group in rows.items():
            if key[:2] == (setting, baseline) and _matches(values, where[key]):
                for run in group:
                    by_seed.setdefault(run.seed, []).append(run)
        return {
            seed: score(found[0], metric, last_k)
            for seed, found in by_seed.items()
            if len(found) == 1
        }

    return [
        _summarize_group(group, target, metric, reference(key[0], where[key]), last_k, key[2])
        for key, group in rows.items()
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
    percent, as in the tables, the plots and ``published``; bytes in bytes."""
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
                100 * value if name in PERCENT_FIELDS else value
                for name, value in zip(header, astuple(row), strict=False)
            ]
            cells[header.index("seeds")] = " ".join(str(s) for s in row.seeds)
            cells[header.index("rounds")] = " ".join(str(r) for r in row.rounds)
            cells[header.index("marks")] = " ".join(row.marks)
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
    if not math.isfinite(row.delta_ci95):
        return f"{100 * row.delta_mean:+.2f}{std}"
    low, high = 100 * (row.delta_mean - row.delta_ci95), 100 * (row.delta_mean + row.delta_ci95)
    star = " *" if _significance(row) else ""
    return f"{100 * row.delta_mean:+.2f}{std} [{low:+.2f}, {high:+.2f}]{star}"


def _significance(row: ResultRow) -> int:
    """+1 / -1 where the paired difference's 95% interval lies above / below 0, else 0."""
    if not (row.delta_seeds >= 2 and math.isfinite(row.delta_ci95)):
        return 0
    if row.delta_mean - row.delta_ci95 > 0:
        return 1
    return -1 if row.delta_mean + row.delta_ci95 < 0 else 0


#: The marks of references rather than methods: the oracle (true labels at the clients) and
#: the centralized reference (every client's images at the server); the summaries give their
#: differences apart from the methods'.
REFERENCE_MARKS = ("oracle", "centralized")


def summary(rows: Sequence[ResultRow], baseline: str, target: float | None = None) -> str:
    """What one setting's rows show against ``baseline``, in words, from the rows alone: the
    baseline's score (mean ± std over seeds) and whether its mean reaches ``target``; each
    reference's (oracle's, centralized reference's) paired difference; and which methods the
    95% interval puts above the baseline, below it, or does not separate from it (each group
    by descending difference)."""
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
        lines.append(text + ".")
    for row in others:
        for mark in REFERENCE_MARKS:
            if mark in row.marks:
                lines.append(f"- {row.method} ({mark}) vs {baseline}: {_points(row, baseline)}.")
    groups = {1: "above", -1: "below", 0: "not separated from"}
    for sign, words in groups.items():
        names = [
            f"{row.method} ({100 * row.delta_mean:+.2f})"
            for row in others
            if _significance(row) == sign and not set(REFERENCE_MARKS) & set(row.marks)
        ]
        lines.append(f"- {words.capitalize()} {baseline} (paired 95% CI): "
                     + (", ".join(names) if names else "none") + ".")  # fmt: skip
    return "\n".join(lines) + "\n"


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
) -> str:
    """Markdown tables, one per setting (``### <setting>``, settings in first-appearance
    order), rows sorted by score (the mean of the last ``last_k`` values) descending;
    the rounds the runs ran (``12-20`` where they differ); accuracies in percent, MB = 10^6
    bytes.
    ``target`` (a fraction) only labels the rounds-to-target column; pass the one given to
    summarize, and the same ``baseline`` for its column of paired differences (points, with
    their 95% interval, ``*`` where it excludes 0). A
    "paper" column is added when ``published`` is given; "finetune" and "linear" columns when
    some row has those final evaluations. With ``baseline``, each table is followed by its
    ``summary``."""
    target_label = f"rounds to {100 * target:g}%" if target is not None else "rounds to target"
    last_k = rows[0].last_k if rows else 1
    header = ["method", "seeds", "rounds", "final test/acc"]
    if last_k > 1:
        header.append(f"mean of last {last_k}")
    if baseline is not None:
        header.append(f"vs {baseline} (paired, 95% CI)")
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
            lines += ["", summary(group, baseline, target).rstrip()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
