"""Figures of runs: learning curves, client class distributions and method diagnostics.

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas, no pyplot state) and
cleared once written; every function returns the written path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from fedlit.reporting.runs import RunRecord

_LINE_STYLES = ("-", "--", ":")  # ten colours, then the next style: 30 lines stay apart
_MARKERS = ("o", "x", "s", "^", "d", "v")  # one per setting in the diagnostics

#: Method diagnostics plotted by plot_diagnostics, in this order, when any run logs them.
DIAGNOSTICS: tuple[str, ...] = (
    "pseudo/pos_frac",
    "pseudo/pos_acc",
    "pseudo/neg_frac",
    "pseudo/neg_acc",
    "switch/use_teacher",
    "kl/teacher",
    "kl/student",
    "diag/weight_diversity",
    "client/mask_rate",
)

#: The diagnostics that are fractions (a share of the images, an accuracy): plotted in
#: percent, as the tables give them.
PERCENT_DIAGNOSTICS = frozenset(k for k in DIAGNOSTICS if k.endswith(("_frac", "_acc", "_rate")))


def _new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure on an Agg canvas."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (parents created), then clear it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=150)
    finally:
        fig.clear()
    return path


def _mean_curve(
    runs: Sequence[RunRecord], key: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, std, count) of ``key`` over runs, on every round any run logs it.

    Each round averages the runs that logged it; std is the sample std (ddof=1), NaN where
    fewer than two runs logged the round.
    """
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for r, v in zip(*run.series(key), strict=True):
            per_round.setdefault(int(r), []).append(float(v))
    rounds = np.array(sorted(per_round), dtype=np.int64)
    groups = [np.asarray(per_round[r]) for r in rounds.tolist()]
    mean = np.array([g.mean() for g in groups], dtype=np.float64)
    std = np.array([g.std(ddof=1) if g.size >= 2 else np.nan for g in groups])
    count = np.array([g.size for g in groups], dtype=np.int64)
    return rounds, mean, std, count


def _group(runs: Sequence[RunRecord], *keys: str) -> dict[tuple[str, ...], list[RunRecord]]:
    """Runs grouped by the given RunRecord attributes, groups in first-appearance order."""
    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(tuple(getattr(run, k) for k in keys), []).append(run)
    return groups


def _method_styles(methods: Sequence[str]) -> dict[str, tuple[str, str]]:
    """method -> (colour, line style): ten colours, then the next line style."""
    return {
        m: (f"C{i % 10}", _LINE_STYLES[i // 10 % len(_LINE_STYLES)]) for i, m in enumerate(methods)
    }


def _grid(fig: Figure, n: int, ncols: int) -> list[Axes]:
    """``n`` axes on a grid of ``ncols`` columns; the unused cells are hidden."""
    nrows = math.ceil(n / ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n]


def plot_curves(runs: Sequence[RunRecord], path: str | Path, metric: str = "test/acc") -> Path:
    """Learning curves: one panel per setting; per method the mean of ``metric`` over seeds
    against the round, shaded ± one std where at least two seeds logged the round. One legend,
    beside the panels; each panel's title gives its number of seeds per method.

    An accuracy (a metric ending in ``acc``) is drawn in percent, as the tables give it.

    Raises ValueError naming the metric if no run logs it.
    """
    scale = 100.0 if metric.endswith("acc") else 1.0
    if not any(run.series(metric)[0].size for run in runs):
        raise ValueError(f"plot_curves: no run logs metric {metric!r}")
    by_setting = _group(runs, "setting")
    methods = list(_group(runs, "method"))
    styles = _method_styles([m for (m,) in methods])
    alpha = 0.2 if len(methods) <= 5 else 0.08  # many overlapping bands: fainter
    ncols = min(3, len(by_setting))
    fig = _new_figure(5.0 * ncols + 2.0, 3.8 * math.ceil(len(by_setting) / ncols))
    axes = _grid(fig, len(by_setting), ncols)
    handles: dict[str, Any] = {}
    for ax, ((setting,), setting_runs) in zip(axes, by_setting.items(), strict=True):
        seeds = set()
        for (method,), method_runs in _group(setting_runs, "method").items():
            rounds, mean, std, count = _mean_curve(method_runs, metric)
            mean, std = scale * mean, scale * std
            if not rounds.size:
                continue
            seeds.add(len(method_runs))
            colour, style = styles[method]
            (line,) = ax.plot(rounds, mean, color=colour, ls=style, marker=".")
            handles.setdefault(method, line)
            band = count >= 2
            if band.any():
                ax.fill_between(
                    rounds,
                    np.where(band, mean - std, mean),
                    np.where(band, mean + std, mean),
                    where=band,
                    color=colour,
                    alpha=alpha,
                    linewidth=0,
                )
        n = "-".join(str(k) for k in sorted({min(seeds), max(seeds)})) if seeds else "0"
        ax.set_title(f"{setting} (mean ± std over n={n} seed{'' if n == '1' else 's'})")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{metric} (%)" if scale == 100.0 else metric)
        ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize="small")
    return _save(fig, path)


def plot_partition(
    class_counts: np.ndarray,
    path: str | Path,
    title: str = "",
    class_names: Sequence[str] | None = None,
    inspect: Callable[[Figure], None] | None = None,
    client_names: Sequence[str] | None = None,
) -> Path:
    """Heat map of a partition: clients (rows) x classes (columns) of example counts, with a
    colour bar from 0 (white: no example of the class) to the largest count, so that an even
    split reads as even; each cell annotated with its count when the grid is at most 20 x 20.
    ``class_names`` (one per column) label the columns, else the class numbers do;
    ``client_names`` (one per row: clients read from folders) label the rows, else the client
    numbers do. Names label at most 20 rows or columns.

    Raises ValueError naming the shape if ``class_counts`` is not a non-empty 2-D array of
    non-negative counts, or if ``class_names`` or ``client_names`` does not name every column
    or row. ``inspect`` is called with the figure before it is written (and cleared).
    """
    counts = np.asarray(class_counts)
    if counts.ndim != 2 or counts.size == 0:
        raise ValueError(
            f"class_counts must be a non-empty (clients, classes) array, got shape {counts.shape}"
        )
    if not np.issubdtype(counts.dtype, np.number) or (counts < 0).any():
        raise ValueError(f"class_counts must hold non-negative counts, got {counts.dtype}")
    if class_names is not None and len(class_names) != counts.shape[1]:
        raise ValueError(
            f"class_names: {len(class_names)} names for {counts.shape[1]} classes (columns)"
        )
    if client_names is not None and len(client_names) != counts.shape[0]:
        raise ValueError(
            f"client_names: {len(client_names)} names for {counts.shape[0]} clients (rows)"
        )
    num_clients, num_classes = counts.shape
    fig = _new_figure(min(2.0 + 0.45 * num_classes, 16.0), min(1.5 + 0.35 * num_clients, 16.0))
    ax = fig.add_subplot()
    image = ax.imshow(
        counts,
        aspect="auto",
        cmap="Blues",
        interpolation="nearest",
        vmin=0,
        vmax=max(counts.max(), 1),
    )
    fig.colorbar(image, ax=ax, label="examples")
    if num_clients <= 20 and num_classes <= 20:
        high = counts.max()
        for (k, c), n in np.ndenumerate(counts):
            colour = "white" if high and n > 0.6 * high else "black"
            ax.text(c, k, f"{n:g}", ha="center", va="center", fontsize=7, color=colour)
    if client_names is not None and num_clients <= 20:
        ax.set_yticks(np.arange(num_clients), list(client_names))
    elif num_clients <= 20 and num_classes <= 20:
        ax.set_yticks(np.arange(num_clients))
    if class_names is not None and num_classes <= 20:
        ax.set_xticks(np.arange(num_classes), list(class_names), rotation=45, ha="right")
    elif num_classes <= 20:
        ax.set_xticks(np.arange(num_classes))
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title:
        ax.set_title(title)
    if inspect is not None:
        inspect(fig)
    return _save(fig, path)


def plot_diagnostics(runs: Sequence[RunRecord], path: str | Path) -> Path | None:
    """One panel per DIAGNOSTICS key that any run logs; per (method, setting) the mean over
    seeds against the round: the method's colour and line style as in :func:`plot_curves`, a
    marker per setting, and one legend of each beside the panels. Returns None, writing
    nothing, when no run logs any of them."""
    keys = [key for key in DIAGNOSTICS if any(run.series(key)[0].size for run in runs)]
    if not keys:
        return None
    styles = _method_styles([m for (m,) in _group(runs, "method")])
    settings = [s for (s,) in _group(runs, "setting")]
    markers = {s: _MARKERS[i % len(_MARKERS)] for i, s in enumerate(settings)}
    ncols = min(3, len(keys))
    fig = _new_figure(4.5 * ncols + 2.0, 3.2 * math.ceil(len(keys) / ncols))
    shown: set[str] = set()
    for ax, key in zip(_grid(fig, len(keys), ncols), keys, strict=True):
        for (method, setting), group_runs in _group(runs, "method", "setting").items():
            rounds, mean, _, _ = _mean_curve(group_runs, key)
            if rounds.size:
                colour, style = styles[method]
                scale = 100 if key in PERCENT_DIAGNOSTICS else 1
                ax.plot(rounds, scale * mean, color=colour, ls=style, marker=markers[setting], ms=4)
                shown.add(method)
        ax.set_title(f"{key} (%)" if key in PERCENT_DIAGNOSTICS else key)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    method_handles = [
        Line2D([], [], color=colour, ls=style, label=m)
        for m, (colour, style) in styles.items()
        if m in shown
    ]
    setting_handles = [
        Line2D([], [], color="black", ls="none", marker=marker, label=s)
        for s, marker in markers.items()
    ]
    fig.legend(handles=method_handles, loc="outside right upper", fontsize="small")
    if len(settings) > 1:
        fig.legend(handles=setting_handles, loc="outside right lower", fontsize="small")
    return _save(fig, path)
