"""FedSEAL's lost classes in a comparison's runs: the models whose class-wise thresholds (paper
002 eq 5, logged as ``fedseal/tau_<m>``) show a class the model almost never predicts, and
their accuracy against the baseline's.

The thresholds logged in round t+1 were measured on the model scored after round t, so each
model after rounds 1..R-1 is paired with the next row's thresholds. Below ``--under`` (0.05:
the confidences of the validation images predicted as that class sum to under 1 per 20 of its
images) a class counts as lost. For each setting: how many models lost a class, their mean
test accuracy minus the baseline's at the same seed and round, the others' mean, and the
lowest threshold logged in any round. Every number comes from the runs' ``metrics.csv``.

    python benchmarks/fedseal_thresholds.py runs/compare/fmnist_warm_long
    python benchmarks/fedseal_thresholds.py runs/compare/fmnist_warm_long_low_lr
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedlit.reporting.runs import load_run


def thresholds(row: dict[str, float]) -> list[float]:
    """The class-wise thresholds of one logged round, in class order."""
    keys = sorted((k for k in row if k.startswith("fedseal/tau_")), key=lambda k: int(k[12:]))
    return [row[k] for k in keys]


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):+.2f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="a comparison's out folder")
    parser.add_argument("--method", default="fedseal", help="the FedSEAL recipe's folder")
    parser.add_argument("--baseline", default="server_sl", help="the baseline's folder")
    parser.add_argument("--under", type=float, default=0.05, help="a lost class's threshold")
    args = parser.parse_args()
    for setting in sorted(p for p in args.out.iterdir() if (p / args.method).is_dir()):
        lost: list[float] = []
        kept: list[float] = []
        lowest = 1.0
        for run_dir in sorted((setting / args.method).glob("seed*")):
            run = load_run(run_dir).history
            base = load_run(setting / args.baseline / run_dir.name).history
            lowest = min([lowest, *(t for row in run for t in thresholds(row))])
            for after, (scored, sent) in enumerate(zip(run, run[1:], strict=False)):
                gap = 100 * (scored["test/acc"] - base[after]["test/acc"])
                (lost if min(thresholds(sent)) < args.under else kept).append(gap)
        models = len(lost) + len(kept)
        print(
            f"{setting.name}: {len(lost)} of {models} models with a class under {args.under} "
            f"(vs the baseline {_mean(lost)}), the others {_mean(kept)}; lowest threshold "
            f"{lowest:.2f}"
        )


if __name__ == "__main__":
    main()
