"""A comparison's cost before it runs: one round of each of its recipes, at one setting and
seed, with the spec's overrides, ``jobs`` at a time as the comparison would run them; prints
each recipe's seconds a round, and its minutes for a run of the spec's rounds.

    OMP_NUM_THREADS=1 python benchmarks/round_times.py recipes/comparisons/fmnist_headroom.yaml \\
        --setting iid --jobs 2

Each round runs from scratch (no warm start: a round's cost is the same), its final
evaluations off, in a temporary folder removed afterwards. A round's seconds are its
``time/round_s``. A run's minutes are that times its rounds: an upper bound where the first
round holds a recipe's training before its rounds (FedSEAL's bootstrap).
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from fedlit.comparison import Comparison, SourceRun, plan
from fedlit.comparison.plan import INIT_FROM_ARG, ROOT_DIR_ARG
from fedlit.comparison.runs import fit_in_subprocess
from fedlit.resolver import resolve


def comparison_of(path: str) -> Comparison:
    """The spec at ``path`` (its nested groups as the CLI builds them)."""
    data = yaml.safe_load(Path(path).read_text())
    if data.get("init_from"):
        data["init_from"] = SourceRun(**data["init_from"])
    for key in ("tune", "wandb", "ray"):
        data.pop(key, None)  # not needed to plan the runs
    return Comparison(**data)


def one_round(args: list[str], run_dir: Path, threads: int) -> float:
    """Run ``args`` for one round into ``run_dir`` (a comparison's ``fedlit fit`` process with
    ``threads`` threads, its output in ``<run_dir>.logs/``); its round's seconds."""
    args = [a for a in args if not a.startswith((INIT_FROM_ARG, ROOT_DIR_ARG))]
    args += ["--federation.rounds=1", "--federation.final_eval=[]", f"{ROOT_DIR_ARG}{run_dir}"]
    fit_in_subprocess(run_dir.with_name(f"{run_dir.name}.logs"), threads)(["fit", *args])
    with open(run_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("time/round_s")]
    return float(rows[-1]["time/round_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--setting", default=None, help="default: the spec's first")
    parser.add_argument("--seed", type=int, default=None, help="default: the spec's first")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    comparison = comparison_of(args.spec)
    setting = args.setting or next(iter(comparison.settings))
    seed = comparison.seeds[0] if args.seed is None else args.seed
    runs = [r for r in plan(comparison) if r.setting == setting and r.seed == seed]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        seconds = list(
            pool.map(lambda r: one_round(list(r.args), Path(tmp) / r.method, threads), runs)
        )
    rounds = {r.method: int(resolve(list(r.args)).config["federation"]["rounds"]) for r in runs}
    print(f"{args.spec}: {setting}, seed {seed}, {args.jobs} at a time, {threads} thread(s)")
    print("| recipe | s / round | min / run |")
    print("|---|---:|---:|")
    for run, s in zip(runs, seconds, strict=True):
        print(f"| {run.method} | {s:.1f} | {s * rounds[run.method] / 60:.1f} |")


if __name__ == "__main__":
    main()
