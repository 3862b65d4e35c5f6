"""A comparison's report: the results table (Markdown and CSV), its plots, and W&B media."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.comparison.plan import PlannedRun
from fedlit.comparison.spec import Comparison
from fedlit.reporting import (
    FINAL_EVAL_KEYS,
    ResultRow,
    RunRecord,
    differing_settings,
    load_run,
    plot_curves,
    plot_diagnostics,
    plot_partition,
    split_settings,
    summarize,
    to_markdown,
    write_csv,
)
from fedlit.reporting.table import PERCENT_FIELDS


def write_report(
    runs: Sequence[RunRecord],
    out: str | Path,
    title: str,
    target: float | None = None,
    published: Mapping[str, Mapping[str, float]] | None = None,
    partitions: Mapping[str, np.ndarray] | None = None,
    about: Sequence[str] = (),
    report: str | Path | None = None,
    baseline: str | None = None,
    last_k: int = 1,
    name: str | None = None,
    calibration: float | None = None,
) -> dict[str, Path]:
    """Write ``results.csv``, ``results.md`` and the plots (``curves.png``, ...) into ``out``,
    or with ``name`` ``<name>.csv``, ``<name>.md`` and ``<name>_curves.png``, ..., so that
    reports of several comparisons can share one folder of runs; with ``report``, the Markdown
    goes there too, its plots copied beside it (``<report's stem>_<plot>.png``).

    Args:
        runs: the runs to report.
        out: the comparison's directory.
        title: the report's heading.
        target: the accuracy "rounds to target" counts to.
        published: method -> setting -> a paper's number (percent).
        partitions: setting -> the (clients x classes) example counts, plotted per setting.
        about: lines (Markdown) said before the tables: how the numbers were made.
        report: a second place for the Markdown report (e.g. ``docs/results/x.md``).
        baseline: the method every other is compared with, seed by seed.
        last_k: each run's score is the mean of its last ``last_k`` rounds' accuracy.
        name: what the files written into ``out`` are named after (None: ``results``).
        calibration: the protocol's calibration (points): each setting's verdict in words.

    Returns:
        name -> path of everything written (``csv``, ``markdown``, ``curves``, ...).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem, prefix = (name, f"{name}_") if name is not None else ("results", "")
    rows = summarize(runs, target=target, baseline=baseline, last_k=last_k)
    written: dict[str, Path] = {"csv": write_csv(rows, out / f"{stem}.csv", published)}
    by_row = split_settings(runs)  # the plots group runs as the tables do
    written["curves"] = plot_curves(by_row, out / f"{prefix}curves.png")
    diagnostics = plot_diagnostics(by_row, out / f"{prefix}diagnostics.png")
    if diagnostics is not None:
        written["diagnostics"] = diagnostics
    for setting, counts in (partitions or {}).items():
        written[f"partition_{setting}"] = plot_partition(
            counts, out / f"{prefix}partition_{setting}.png", title=f"partition: {setting}"
        )
    table = to_markdown(
        rows, target=target, published=published, baseline=baseline, calibration=calibration
    )
    table += differing_settings(runs) + warm_starts(runs, out)
    written["markdown"] = out / f"{stem}.md"
    written["markdown"].write_text(_document(title, about, table, written, out))
    if report is not None:
        report = Path(report)
        report.parent.mkdir(parents=True, exist_ok=True)
        copies = {}
        for key, path in written.items():
            if path.suffix == ".png":
                copies[key] = report.parent / f"{report.stem}_{key}.png"
                shutil.copyfile(path, copies[key])
        report.write_text(_document(title, about, table, copies, report.parent))
        written["report"] = report
    return written


def terminal_table(
    runs: Sequence[RunRecord],
    target: float | None = None,
    baseline: str | None = None,
    last_k: int = 1,
    calibration: float | None = None,
) -> str:
    """The report's main tables as the terminal shows them: each setting's results with their
    flags, summary (and calibration verdict) and server budgets
    (:func:`~fedlit.reporting.to_markdown`)."""
    rows = summarize(runs, target=target, baseline=baseline, last_k=last_k)
    return to_markdown(rows, target=target, baseline=baseline, calibration=calibration)


def warm_starts(runs: Sequence[RunRecord], base: str | Path | None = None) -> str:
    """The warm-started runs' sources (run.json ``init_from``: its checkpoint's path, absolute
    or, in a saved record, from the run's folder) as a Markdown table, one row a source: its
    checkpoint (relative to ``base``, the comparison's folder, where given), method,
    round, test accuracy, the SHA-256 of its weights and the runs that started from it (by
    setting and seed); empty where no run was warm-started."""
    sources: dict[tuple[str, str], list[RunRecord]] = {}
    for run in runs:
        if run.init_from:
            path = str(run.init_from.get("path"))
            if not Path(path).is_absolute():  # a saved record's: from the run's folder
                path = os.path.normpath(Path(run.run_dir).resolve() / path)
            key = (path, str(run.init_from.get("sha256")))
            sources.setdefault(key, []).append(run)
    if not sources:
        return ""
    lines = [
        "",
        "### Warm starts",
        "",
        "| source checkpoint (from the comparison's folder) | method | round | test/acc | "
        "SHA-256 of its weights | runs |",
        "|---|---|---|---|---|---|",
    ]
    for (path, sha), started in sources.items():
        info = started[0].init_from
        acc = info.get("test_acc")
        shown = f"{100 * acc:.2f}" if isinstance(acc, (int, float)) else "-"
        who = sorted({f"{r.setting} seed {r.seed}" for r in started})
        if base is not None and Path(path).is_absolute():  # no machine's own folders
            path = os.path.relpath(path, Path(base).resolve())
        lines.append(
            f"| `{path}` | {info.get('method', '-')} | {info.get('round', '-')} | {shown} | "
            f"`{sha}` | {len(started)} ({', '.join(who)}) |"
        )
    return "\n".join(lines) + "\n"


def _document(
    title: str, about: Sequence[str], table: str, plots: Mapping[str, Path], base: Path
) -> str:
    lines = [f"# {title}", "", *about, "", table.rstrip(), ""]
    for name, path in plots.items():
        if path.suffix == ".png":
            lines += [f"![{name}]({path.relative_to(base)})", ""]
    return "\n".join(lines)


def rerun_id(project: str, group: str, folder: str | Path, kind: str = "") -> str:
    """The W&B run id of a comparison's ``kind`` of summary run ("": its results) in
    ``folder``: one run per folder, so a re-run logs into it again, not into a new run."""
    key = f"{project}/{group}/{Path(folder).resolve()}" + (f"/{kind}" if kind else "")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def log_to_wandb(
    runs: Sequence[RunRecord],
    written: Mapping[str, Path],
    project: str,
    group: str,
    offline: bool,
    save_dir: str | Path,
    target: float | None = None,
    baseline: str | None = None,
    last_k: int = 1,
) -> Path:
    """One W&B run in the comparison's group holding the results table and the plots (the
    same run at each re-run of the comparison in ``save_dir``).

    Returns the run's local directory.
    """
    import wandb

    rows = summarize(runs, target=target, baseline=baseline, last_k=last_k)
    columns, data = wandb_table(rows)
    run = wandb.init(
        project=project,
        group=group,
        name=f"{group}/results",
        id=rerun_id(project, group, save_dir),
        resume="allow",
        job_type="report",
        dir=str(save_dir),
        mode="offline" if offline else "online",
        config={"runs": len(runs)},
        settings={"quiet": True},  # no summary block: the terminal's table comes last
    )
    media: dict[str, Any] = {"results": wandb.Table(columns=list[str | int](columns), data=data)}
    for name, path in written.items():
        if path.suffix == ".png":
            media[f"plots/{name}"] = wandb.Image(str(path))
    run.log(media)
    directory = Path(run.dir).parent
    run.finish()
    return directory


def wandb_table(rows: Sequence[ResultRow]) -> tuple[list[str], list[list[Any]]]:
    """The results table as W&B shows it, in the report's units: the columns of
    ``results.csv`` (the accuracies and their stds in percent, the paired differences in
    points), except that the paired difference's 95% interval is given by its bounds,
    ``delta_ci95_low`` and ``delta_ci95_high`` (points), not by its half-width, and the
    clients' confident fraction is in percent too; seeds, rounds and marks space-joined, flags
    "; "-joined. Returns the columns and the rows' cells."""
    columns: list[str] = []
    for f in fields(ResultRow):
        columns += ["delta_ci95_low", "delta_ci95_high"] if f.name == "delta_ci95" else [f.name]
    data = []
    for row in rows:
        cells: list[Any] = []
        for f in fields(ResultRow):
            value = getattr(row, f.name)
            if f.name == "delta_ci95":
                cells += [100 * (row.delta_mean - value), 100 * (row.delta_mean + value)]
                continue
            if f.name in PERCENT_FIELDS or f.name == "client_activity":
                value = 100 * value
            elif isinstance(value, tuple):
                value = ("; " if f.name == "flags" else " ").join(map(str, value))
            cells.append(value)
        data.append(cells)
    return columns, data


def run_counts(total: int, counts: Mapping[str, int]) -> str:
    """How a report's runs came to be, opening a parenthesis its caller closes:
    ``4 runs (3 new, 1 resumed, 0 finished before`` (``counts``: the runs run,
    resumed and skipped)."""
    runs = f"{total} run" + ("" if total == 1 else "s")
    return (
        f"{runs} ({counts['run']} new, {counts['resumed']} resumed, {counts['skipped']} "
        "finished before"
    )


def about_lines(
    comparison: Comparison,
    records: Sequence[RunRecord],
    sources: Sequence[PlannedRun],
    counts: Mapping[str, int],
    minutes: float,
    command: str,
) -> list[str]:
    """The lines that open a comparison's report: its description, how it was made
    (``command``; the runs run, resumed and skipped: ``counts``; this invocation's
    ``minutes``; the runs' own compute time), its recipes, seeds, settings and overrides,
    its warm starts' sources, and what the table's columns mean."""
    compute = sum(row.get("time/round_s", 0.0) for r in records for row in r.history) / 60
    settings = [
        f"- setting `{name}`: `{' '.join(args) or '(the recipes as they are)'}`"
        for name, args in comparison.settings.items()
    ]
    given = [key for key in ("seeds", "settings", "recipes", "overrides") if f"--{key}" in command]
    if comparison.description and given:  # the spec's words may name what the command changed
        keys = ", ".join(f"`{key}`" for key in given)
        about = [
            *comparison.description,
            "",
            f"*The description above is the spec's; this command gave its own {keys} (below).*",
        ]
    else:
        about = list(comparison.description)
    about += [
        "",
        f"Made by `{command}`: {run_counts(len(records), counts)}; this invocation took "
        f"{minutes:.1f} min; the runs' rounds took {compute:.1f} min in all). Every number "
        "below comes from those runs.",
        "",
        f"- recipes: {', '.join(f'`{r}`' for r in comparison.recipes)}",
        f"- seeds: {list(comparison.seeds)}",
        *settings,
        f"- every run: `{' '.join(comparison.overrides) or '(no overrides)'}`",
        *[
            f"- `{stem}` only: `{' '.join(args)}`"
            for stem, args in comparison.recipe_overrides.items()
        ],
    ]
    if comparison.init_from is not None:
        about += _source_lines(comparison, sources)
    if comparison.baseline is not None:
        about.append(
            f"- *vs {comparison.baseline} (paired, 95% CI)*: per seed, the method's score "
            f"minus {comparison.baseline}'s with the same seed (the same labeled set and "
            "partition); mean ± sample std over the seeds, in points, then the two-sided 95% "
            "t-interval of the mean difference; `*` where it excludes 0."
        )
    if comparison.last_k > 1:
        about.append(
            f"- *mean of last {comparison.last_k}*: each run's score, the mean of its last "
            f"{comparison.last_k} rounds' test/acc (less of one round's noise than the last)."
        )
    if any(r.series(key)[1].size for r in records for key in FINAL_EVAL_KEYS.values()):
        about.append(
            "- *finetune / linear (final eval)*: the global encoder after the last round, "
            "fine-tuned end to end / with a linear classifier on the server's labeled set "
            "(`federation.final_eval`), for the recipes that ask for it."
        )
    return about


def _source_lines(comparison: Comparison, sources: Sequence[PlannedRun]) -> list[str]:
    """What the report says of the runs every run started from: the recipe, its overrides,
    where they are, and each one's final test accuracy."""
    assert comparison.init_from is not None
    source = comparison.init_from
    scores = []
    for run in sources:
        history = load_run(run.run_dir).history
        acc = history[-1].get("test/acc") if history else None
        shown = f"{100 * acc:.2f}" if acc is not None else "-"
        scores.append(f"{run.setting} seed {run.seed}: {shown}")
    return [
        f"- *warm start*: every run starts (`federation.init_from`) from the final network of "
        f"`{source.recipe}` with `{' '.join(source.overrides) or '(no overrides)'}` (after "
        "the comparison's and the setting's overrides), run once per setting and seed, before "
        f"the others, in `{comparison.out}/<setting>/{source.folder}/seed<k>` (one for "
        "the settings that change only the clients' partition, where it trains no clients: "
        "the same server data, the same weights); its test/acc "
        f"(%): {'; '.join(scores)}. The *Warm starts* table names each source's weights by "
        "their SHA-256.",
    ]
