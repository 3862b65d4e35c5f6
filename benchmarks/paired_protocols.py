"""Paired differences between runs of comparisons that share their seeds and settings: one
method under two protocols, or two methods of one comparison, with a paired t-interval, and
each side's mean test accuracy by round.

Each pair ``A`` or ``A:B`` names a recipe folder in the first comparison's out folder and one in
the second's (``A:A`` when only ``A`` is given; the second out folder is the first when it is
left out). Each setting of the first is paired with the same setting of the second, or, with
``--settings S:T``, setting ``S`` of the first with setting ``T`` of the second (one comparison
whose settings differ in one thing, e.g. the precision). Per pair of settings, the per-seed
differences (second side minus first) of the runs' scores (the mean of the last ``--last_k``
rounds' test accuracy, as in the comparison's table), their mean and the two-sided t-interval
(95%, or ``--confidence``: e.g. 0.9833 for one of three protocols looked at, Bonferroni); then
each side's mean test accuracy at each round and each seed's lowest round. Every number comes
from the runs' ``metrics.csv``; a run missing on either side, or an unfinished one, is refused
by name.

    python benchmarks/paired_protocols.py runs/compare/fmnist_warm_long \\
        --second runs/compare/fmnist_warm_long_low_lr --pairs fedseal,fedavg_fixmatch,fedavg_sl
    python benchmarks/paired_protocols.py runs/compare/fmnist_warm_long \\
        --pairs fedavg_fixmatch:fedseal,fedseal:centralized_fixmatch_joint
    python benchmarks/paired_protocols.py runs/compare/cpu_precision --settings fp32:bf16 \\
        --pairs server_sl,fedavg_sl,fedavg_fixmatch,fedseal
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedlit.reporting.runs import RunRecord, load_run
from fedlit.reporting.table import ci95, score

ACC = "test/acc"


def _finished(run_dir: Path) -> RunRecord:
    try:
        run = load_run(run_dir)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if not run.finished:
        raise SystemExit(f"{run_dir}: unfinished (round {run.last_round} of {run.rounds})")
    return run


def _pair(text: str) -> tuple[str, str]:
    """``"A:B"`` -> (A, B); ``"A"`` -> (A, A)."""
    first, _, second = text.partition(":")
    return first, second or first


def by_round(runs: list[RunRecord]) -> list[float]:
    """The mean test/acc (points) over ``runs`` at each round."""
    curves = [run.series(ACC)[1] for run in runs]
    return [100 * statistics.mean(float(c[i]) for c in curves) for i in range(len(curves[0]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path, help="a comparison's out folder")
    parser.add_argument(
        "--second", type=Path, default=None, help="another (the same settings and seeds)"
    )
    parser.add_argument("--pairs", required=True, help="A or A:B recipe folders, comma-separated")
    parser.add_argument(
        "--settings", default=None, help="S:T, comma-separated: setting S of the first with T"
    )
    parser.add_argument("--last_k", type=int, default=3, help="score: mean of the last K rounds")
    parser.add_argument("--confidence", type=float, default=0.95, help="the interval's level")
    args = parser.parse_args()
    second_out = args.second or args.first
    pairs = [_pair(text) for text in args.pairs.split(",")]
    if args.settings is None:
        names = sorted(p.name for p in args.first.iterdir() if (p / pairs[0][0]).is_dir())
        if not names:
            raise SystemExit(f"{args.first}: no setting folder holds {pairs[0][0]!r}")
        settings = [(name, name) for name in names]
    else:
        settings = [_pair(text) for text in args.settings.split(",")]
    print(
        f"second side minus first, score = mean of last {args.last_k} rounds' test/acc, "
        f"{100 * args.confidence:g}% t-intervals"
    )
    for ours, theirs in settings:
        for a, b in pairs:
            seeds = sorted(p.name for p in (args.first / ours / a).glob("seed*"))
            if not seeds:
                raise SystemExit(f"{args.first / ours / a}: no seed folder")
            first = [_finished(args.first / ours / a / seed) for seed in seeds]
            second = [_finished(second_out / theirs / b / seed) for seed in seeds]
            matched = zip(first, second, strict=True)
            diffs = [
                100 * (score(y, ACC, args.last_k) - score(x, ACC, args.last_k)) for x, y in matched
            ]
            mean, half = statistics.mean(diffs), ci95(diffs, args.confidence)
            print(
                f"{ours if ours == theirs else f'{ours}:{theirs}'}: "
                f"{second_out / theirs / b} - {args.first / ours / a} "
                f"({len(seeds)} seeds): "
                f"{mean:+.2f} "
                f"[{mean - half:+.3f}, {mean + half:+.3f}]; per seed "
                + ", ".join(f"{d:+.2f}" for d in diffs)
            )
            for name, runs in (("first", first), ("second", second)):
                lowest = [100 * float(run.series(ACC)[1].min()) for run in runs]
                print(
                    f"    {name} by round: "
                    + ", ".join(f"{m:.2f}" for m in by_round(runs))
                    + "; lowest round per seed: "
                    + ", ".join(f"{m:.1f}" for m in lowest)
                )


if __name__ == "__main__":
    main()
