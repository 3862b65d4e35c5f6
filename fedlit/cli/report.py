"""``fedlit report``: the results table and plots of finished runs."""

from __future__ import annotations

import json
from collections.abc import Sequence

from fedlit.federation.console import warn
from fedlit.refusals import (
    OneLineParser,
)
from fedlit.run_layout import METRICS_FILE, TEST_ACC, write_path_error


def report_parser() -> OneLineParser:
    """``fedlit report``'s parser: its arguments, parsed without reading any run."""
    parser = OneLineParser(prog="fedlit report", description="Results table and plots of runs.")
    parser.add_argument("paths", nargs="+", type=str, help="run directories or folders of runs")
    parser.add_argument("--target", type=float | None, default=None)
    parser.add_argument("--baseline", type=str | None, default=None, help="method to compare with")
    parser.add_argument("--last_k", type=int, default=1, help="score: mean of the last K rounds")
    parser.add_argument(
        "--calibration",
        type=float | None,
        default=None,
        help="points: each setting's verdict on the oracle's difference from the baseline",
    )
    parser.add_argument("--out", type=str, default="report")
    parser.add_argument("--title", type=str, default="fedlit runs")
    return parser


def report_main(argv: Sequence[str]) -> None:
    """``fedlit report RUN_OR_FOLDER... [--target 0.8] [--baseline M] [--last_k K]
    [--calibration POINTS] [--out DIR] [--title T]``: writes the report into ``--out``,
    prints its main tables, then the written files as JSON."""
    from fedlit.comparison.report import terminal_table, write_report
    from fedlit.reporting import find_runs, last_k_warning, summarize

    parser = report_parser()
    cfg = parser.parse_args(list(argv))
    error = write_path_error(cfg.out, "--out", "folder")
    if error:
        parser.error(error)
    if cfg.calibration is not None and cfg.baseline is None:
        parser.error(
            f"--calibration={cfg.calibration}: give a --baseline (the oracle's difference "
            "from it is what is calibrated)"
        )
    try:
        runs = find_runs(cfg.paths)
        # a bad baseline or last_k fails before anything is written
        summarize(runs, baseline=cfg.baseline, last_k=cfg.last_k)
    except ValueError as err:
        parser.error(str(err))
    empty = [run.run_dir for run in runs if not run.series(TEST_ACC)[1].size]
    if len(empty) == len(runs):  # nothing to tabulate or plot
        others = f" and {len(empty) - 1} other run(s)" if len(empty) > 1 else ""
        parser.error(
            f"{empty[0]}{others}: no round logged yet ({METRICS_FILE} holds no {TEST_ACC}); "
            "nothing to report"
        )
    if empty:
        warn(
            f"{len(empty)} run(s) logged no round yet ({', '.join(map(str, empty))}): their rows "
            "show '-'"
        )
    short = last_k_warning(runs, cfg.last_k, "--last_k")
    if short:
        warn(short)
    written = write_report(
        runs,
        cfg.out,
        cfg.title,
        target=cfg.target,
        baseline=cfg.baseline,
        last_k=cfg.last_k,
        calibration=cfg.calibration,
    )
    print(terminal_table(runs, cfg.target, cfg.baseline, cfg.last_k, cfg.calibration))
    print(json.dumps({k: str(v) for k, v in written.items()}))
