"""FedSEAL's diagnosis: the recipe and its ablations beside its lower bound, per round.

Runs a FedSEAL recipe as it is (``full``) and once per ablation, each a recipe override
(``ABLATIONS``), and the Server-SL recipe (the lower bound) with the same common overrides and
seeds, and Server-SL variants that train the server as much as FedSEAL or FedAvg-FixMatch do
(``BASELINE_VARIANTS``), then writes a Markdown report: each run's score (the mean of its last
``last_k`` rounds' test accuracy) and its paired difference from Server-SL and from ``full``;
and per round the scored accuracy, the positive and negative sets' sizes and label accuracies
(paper 002's Fig 3), lambda, and the class-wise thresholds tau (Fig 4); the ``full`` and
``no_self_ensemble`` curves side by side are Fig 5. Every number in the report comes from the
runs the command made (or found finished: a finished run is skipped, an interrupted one resumed
from its checkpoint, so re-running the command continues where it stopped).

    python benchmarks/fedseal_diagnosis.py --recipe recipes/fedseal.yaml \\
        --baseline recipes/server_sl.yaml --seeds 0 1 2 --out runs/diagnosis/fedseal \\
        --report docs/results/fedseal.md --jobs 2 -- --federation.rounds=12
    python benchmarks/fedseal_diagnosis.py --ablations full no_negative_learning \
        --baselines server_sl_matched \
        --fedseal_overrides='--model.init_args.bootstrap_epochs=5' -- ...

Arguments after ``--`` are overrides for every run (``fedlit fit`` syntax);
``--fedseal_overrides`` (one quoted string) for the FedSEAL runs only. Every run's
arguments are parsed before the first run starts: a bad key or value stops the command
(exit 2) with nothing written.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedlit.cli import main as fedlit_main
from fedlit.cli import resolve
from fedlit.comparison.plan import ROOT_DIR_ARG, PlannedRun
from fedlit.comparison.report import run_counts
from fedlit.comparison.runner import execute, fit_in_subprocess
from fedlit.reporting import load_run
from fedlit.reporting.runs import RunRecord
from fedlit.reporting.table import ci95, score

MODEL = "--model.init_args."
BASELINE = "server_sl"
FULL = "full"


def _scaled(config: Mapping[str, Any], key: str, factor: float, kind: type = int) -> str:
    """An override setting ``key`` (dotted, in the resolved config) to ``factor`` times the
    recipe's value (an int at least 1 for epochs and rounds)."""
    node: Any = config
    for part in key.split("."):
        node = node[part]
    if kind is int:
        return f"--{key}={max(1, int(node * factor))}"
    return f"--{key}={node * factor:.6g}"


#: name -> (what it changes, its overrides given the FedSEAL run's resolved config)
ABLATIONS: dict[str, tuple[str, Callable[[Mapping[str, Any]], list[str]]]] = {
    FULL: ("the recipe as it is", lambda c: []),
    "no_self_ensemble": (
        "pseudo-labels of the current model alone (5.2.5, Fig 5)",
        lambda c: [f"{MODEL}self_ensemble=false"],
    ),
    "no_negative_learning": (
        "no complementary set: L = lambda L+ (5.2.3)",
        lambda c: [f"{MODEL}loss.negative_learning=false"],
    ),
    "fixed_tau_0.9": (
        "one threshold 0.9 for every class (5.2.4)",
        lambda c: [f"{MODEL}loss.fixed_tau=0.9"],
    ),
    "fixed_tau_0.5": (
        "one threshold 0.5 for every class (5.2.4)",
        lambda c: [f"{MODEL}loss.fixed_tau=0.5"],
    ),
    "no_bootstrap": (
        "no bootstrap: the server trains Server-SL's epochs exactly (round 1's clients, "
        "with tau = 1, get no positive set; their self-ensembles hold w^0's predictions)",
        lambda c: [f"{MODEL}bootstrap_epochs=0"],
    ),
    "no_ramp": ("lambda = lambda_max from round 1", lambda c: [f"{MODEL}loss.ramp=0"]),
    "ramp_whole_run": ("lambda ramps up over the whole run", lambda c: [f"{MODEL}loss.ramp=1"]),
    "local_epochs_x3": (
        "three times the recipe's local epochs",
        lambda c: [_scaled(c, "federation.local_epochs", 3)],
    ),
    "server_epochs_1": (
        "one server epoch a round",
        lambda c: ["--federation.server_epochs=1"],
    ),
    "client_lr_x3": (
        "three times the recipe's client learning rate",
        lambda c: [_scaled(c, "model.init_args.optim.client_lr", 3, float)],
    ),
    "server_lr_div3": (
        "a third of the recipe's server learning rate (a lighter server step after averaging)",
        lambda c: [_scaled(c, "model.init_args.optim.server_lr", 1 / 3, float)],
    ),
    "client_lr_div3": (
        "a third of the recipe's client learning rate",
        lambda c: [_scaled(c, "model.init_args.optim.client_lr", 1 / 3, float)],
    ),
    "rounds_x2": (
        "twice the rounds (the schedules stretched over them)",
        lambda c: [_scaled(c, "federation.rounds", 2)],
    ),
}


def _matched_epochs(c: Mapping[str, Any]) -> int:
    """Server epochs a round that give Server-SL about the server training of the FedSEAL run
    ``c`` in all: its rounds' epochs plus its bootstrap, rounded."""
    rounds = int(c["federation"]["rounds"])
    total = rounds * int(c["federation"]["server_epochs"]) + int(
        c["model"]["init_args"]["bootstrap_epochs"]
    )
    return max(1, round(total / rounds))


#: name -> (what it changes, overrides of the Server-SL recipe given the FedSEAL run's
#: resolved config): lower bounds that train the server as much as a FedSEAL variant does
BASELINE_VARIANTS: dict[str, tuple[str, Callable[[Mapping[str, Any]], list[str]]]] = {
    "server_sl_matched": (
        "Server-SL with about FedSEAL's server epochs in all (its bootstrap spread over the "
        "rounds)",
        lambda c: [f"--federation.server_epochs={_matched_epochs(c)}"],
    ),
    "server_sl_x2": (
        "Server-SL with twice the server epochs a round (FedAvg-FixMatch's and FedAvg-UDA's "
        "server training: before sending and after averaging)",
        lambda c: [_scaled(c, "federation.server_epochs", 2)],
    ),
    "server_sl_1_epoch": (
        "Server-SL with one server epoch a round (the lower bound of server_epochs_1)",
        lambda c: ["--federation.server_epochs=1"],
    ),
}

SETS = ("pseudo/pos_frac", "pseudo/pos_acc", "pseudo/neg_frac", "pseudo/neg_acc")


def plan(
    recipe: Path,
    baseline: Path,
    ablations: Sequence[str],
    seeds: Sequence[int],
    overrides: Sequence[str],
    out: Path,
    config: Mapping[str, Any],
    baselines: Sequence[str] = (),
) -> list[PlannedRun]:
    """The runs: Server-SL, then FedSEAL as it is and per ablation, then the Server-SL
    variants in ``baselines``, seed by seed, in ``out/<name>/seed<k>`` (the ablation's or
    variant's name is the run's setting)."""
    runs = []
    no_final_eval = ["--federation.final_eval=[]"]  # Server-SL's encoder protocols: not needed
    named = [(BASELINE, baseline, no_final_eval)]
    named += [(a, recipe, ABLATIONS[a][1](config)) for a in ablations]
    named += [(b, baseline, [*no_final_eval, *BASELINE_VARIANTS[b][1](config)]) for b in baselines]
    for name, path, extra in named:
        for seed in seeds:
            run_dir = out / name / f"seed{seed}"
            args = (
                f"--config={path}",
                *overrides,
                *extra,
                f"--seed_everything={seed}",
                f"{ROOT_DIR_ARG}{run_dir}",
            )
            runs.append(PlannedRun(path, name, seed, run_dir, args))
    return runs


def _with(run: PlannedRun, extra: Sequence[str]) -> PlannedRun:
    """``run`` with ``extra`` overrides after its common ones (before the seed and its
    directory)."""
    args = (*run.args[:-2], *extra, *run.args[-2:])
    return PlannedRun(run.recipe, run.setting, run.seed, run.run_dir, args)


# ----------------------------------------------------------------------------- report


def _paired(ours: Mapping[int, float], theirs: Mapping[int, float]) -> str:
    """Mean paired difference in points, with its 95% interval over the shared seeds."""
    diffs = [100 * (ours[s] - theirs[s]) for s in sorted(ours) if s in theirs]
    if not diffs:
        return "-"
    mean = float(np.mean(diffs))
    if len(diffs) < 2:
        return f"{mean:+.2f}"
    half = ci95(diffs)
    mark = "*" if abs(mean) > half else ""
    return f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]{mark}"


def _mean_series(runs: Sequence[RunRecord], key: str) -> dict[int, float]:
    """Round -> the mean over runs of ``key`` (rounds where any run logged it)."""
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for r, v in zip(*run.series(key), strict=True):
            per_round.setdefault(int(r), []).append(float(v))
    return {r: float(np.mean(v)) for r, v in sorted(per_round.items())}


def _cell(values: Mapping[int, float], r: int, scale: float = 100.0, digits: int = 1) -> str:
    return f"{scale * values[r]:.{digits}f}" if r in values else "-"


def report(
    runs: Sequence[RunRecord],
    ablations: Sequence[str],
    last_k: int,
    header: Sequence[str],
    baselines: Sequence[str] = (),
) -> str:
    """The Markdown report of finished runs (grouped by their setting: an ablation's name,
    ``server_sl`` or a Server-SL variant's name)."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(run.setting, []).append(run)
    scores = {
        name: {r.seed: score(r, "test/acc", last_k) for r in rs} for name, rs in groups.items()
    }
    lines = [*header, "", f"## Scores (mean of the last {last_k} rounds' test accuracy, %)", ""]
    lines += [
        f"| run | what it changes | score (mean ± std) | vs {BASELINE} (paired, 95% CI) | "
        f"vs {FULL} (paired, 95% CI) | pos_frac | pos_acc | neg_frac | neg_acc |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in [BASELINE, *ablations, *baselines]:
        values = list(scores[name].values())
        std = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
        if name == BASELINE:
            what = "the lower bound: the server's labels only"
        else:
            what = (ABLATIONS[name] if name in ABLATIONS else BASELINE_VARIANTS[name])[0]
        last = [_mean_series(groups[name], key) for key in SETS]
        final = [f"{100 * s[max(s)]:.1f}" if s else "-" for s in last]
        lines.append(
            f"| {name} | {what} | {100 * np.mean(values):.2f} ± {100 * std:.2f} | "
            f"{_paired(scores[name], scores[BASELINE]) if name != BASELINE else '-'} | "
            f"{_paired(scores[name], scores[FULL]) if FULL in scores and name not in (FULL, BASELINE) else '-'} | "  # noqa: E501
            + " | ".join(final)
            + " |"
        )
    lines += [
        "",
        "pos_frac / neg_frac: the share of the clients' images in the positive / complementary "
        "set in the last round; pos_acc / neg_acc: how many of their pseudo-labels are right / "
        "complementary labels are really wrong (against the clients' held-back labels, a "
        "diagnosis only). `*`: the interval excludes 0.",
    ]
    for name in [a for a in ablations if a in groups]:
        rs = groups[name]
        acc = _mean_series(rs, "test/acc")
        base = _mean_series(groups[BASELINE], "test/acc")
        per_set = [_mean_series(rs, key) for key in SETS]
        lam = _mean_series(rs, "fedseal/lambda")
        taus = [_mean_series(rs, f"fedseal/tau_{m}") for m in range(_num_classes(rs))]
        lines += [
            "",
            f"## Per round: {name} ({ABLATIONS[name][0]}; mean over seeds)",
            "",
            "| round | test acc | server_sl acc | pos_frac | pos_acc | neg_frac | neg_acc | "
            "lambda | " + " | ".join(f"tau_{m}" for m in range(len(taus))) + " |",
            "| " + " | ".join(["---"] * (8 + len(taus))) + " |",
        ]
        for r in sorted(acc):
            lines.append(
                f"| {r} | {_cell(acc, r)} | {_cell(base, r)} | "
                + " | ".join(_cell(s, r) for s in per_set)
                + f" | {_cell(lam, r, 1.0, 3)} | "
                + " | ".join(_cell(t, r, 1.0, 2) for t in taus)
                + " |"
            )
    return "\n".join(lines) + "\n"


def _num_classes(runs: Sequence[RunRecord]) -> int:
    keys = {k for run in runs for row in run.history for k in row}
    return sum(1 for k in keys if k.startswith("fedseal/tau_"))


# ----------------------------------------------------------------------------- command


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=Path("recipes/fedseal.yaml"))
    parser.add_argument("--baseline", type=Path, default=Path("recipes/server_sl.yaml"))
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS), metavar="NAME")
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=list(BASELINE_VARIANTS),
        metavar="NAME",
        help=f"Server-SL variants to run beside server_sl (default all: {list(BASELINE_VARIANTS)})",
    )
    parser.add_argument(
        "--preface",
        type=Path,
        default=None,
        help="a Markdown file (a reading of the results) put after the report's header",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/diagnosis/fedseal"))
    parser.add_argument("--report", type=Path, default=None, help="also write the report here")
    parser.add_argument("--last_k", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument(
        "--fedseal_overrides",
        type=shlex.split,
        default=[],
        help="overrides for the FedSEAL runs only, one quoted string "
        "(--fedseal_overrides='--model.init_args.bootstrap_epochs=5')",
    )
    args = parser.parse_args(ours)
    unknown = [a for a in args.ablations if a not in ABLATIONS]
    if unknown:
        parser.error(f"--ablations: unknown {unknown}; known: {list(ABLATIONS)}")
    unknown = [b for b in args.baselines if b not in BASELINE_VARIANTS]
    if unknown:
        parser.error(f"--baselines: unknown {unknown}; known: {list(BASELINE_VARIANTS)}")
    if FULL not in args.ablations:
        args.ablations.insert(0, FULL)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct, got {args.seeds}")
    if args.last_k < 1 or args.jobs < 1:
        parser.error(f"--last_k and --jobs must be >= 1, got {args.last_k} and {args.jobs}")
    if args.preface is not None and not args.preface.is_file():
        parser.error(f"--preface: no such file {str(args.preface)!r}")
    for key in ("recipe", "baseline"):
        if not getattr(args, key).is_file():
            parser.error(f"--{key}: no such file {str(getattr(args, key))!r}")
    return args, overrides


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the diagnosis; returns the report's path (``<out>/fedseal.md``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parse(argv)
    fedseal = [*overrides, *args.fedseal_overrides]
    config = resolve([f"--config={args.recipe}", *fedseal]).config.as_dict()
    runs = plan(
        args.recipe,
        args.baseline,
        args.ablations,
        args.seeds,
        overrides,
        args.out,
        config,
        args.baselines,
    )
    lower = (BASELINE, *BASELINE_VARIANTS)
    runs = [_with(run, args.fedseal_overrides) if run.setting not in lower else run for run in runs]
    rounds = {}
    for run in runs:  # every run's arguments are checked before the first one starts
        if run.seed == args.seeds[0]:
            checked = int(resolve(run.args).config["federation"]["rounds"])
        rounds[run] = checked
    start = time.perf_counter()
    if args.jobs > 1:
        fit = fit_in_subprocess(args.out / "logs", threads=1)
        counts = execute(runs, rounds, fit, jobs=args.jobs)
    else:
        counts = execute(runs, rounds, fedlit_main)
    minutes = (time.perf_counter() - start) / 60
    records = [load_run(run.run_dir) for run in runs]
    compute = sum(row.get("time/round_s", 0.0) for r in records for row in r.history) / 60
    command = shlex.join(["python", "benchmarks/fedseal_diagnosis.py", *argv])
    header = [
        "# FedSEAL diagnosis",
        "",
        f"Made by `{command}`: {run_counts(len(runs), counts)}; this invocation took "
        f"{minutes:.1f} min, the runs' rounds {compute:.1f} min in all). Every number below "
        "comes from those runs.",
        "",
        f"- FedSEAL recipe: `{args.recipe}`; lower bound: `{args.baseline}`",
        f"- seeds: {args.seeds}; every run: `{' '.join(overrides) or '(no overrides)'}`; "
        f"the FedSEAL runs also: `{' '.join(args.fedseal_overrides) or '(none)'}`",
        "- paper 002's figures, for comparison: Fig 3, the complementary labels' correct "
        "rate (neg_acc) well above the pseudo-labels' (pos_acc) in the first rounds; Fig 4, "
        "class thresholds that differ between classes; Fig 5, FedSEAL above FedSEAL w/o "
        "self-ensemble within 20 rounds (IID).",
    ]
    if args.preface is not None:
        header += ["", args.preface.read_text().rstrip()]
    text = report(records, args.ablations, args.last_k, header, args.baselines)
    written = args.out / "fedseal.md"
    written.write_text(text)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    print(written)
    return written


if __name__ == "__main__":
    main()
