"""Tests for fedlit.reporting: run directories read back, result tables and figures."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import recording_wandb_init

from fedlit.reporting import (
    DIAGNOSTICS,
    ResultRow,
    RunRecord,
    find_runs,
    load_run,
    plot_curves,
    plot_diagnostics,
    plot_partition,
    summarize,
    to_markdown,
    write_csv,
)
from fedlit.comparison.report import wandb_table
from fedlit.reporting.table import (
    calibration_verdict,
    headroom_shares,
    headroom_verdict,
    summary,
    t_quantile,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ROUNDS = 4
TARGET = 0.8

#: (setting, method, seed) -> per-round test/acc of the synthetic runs, rounds 1, 2, ...
ACC: dict[tuple[str, str, int], list[float]] = {
    ("iid", "FedSEAL", 0): [0.50, 0.70, 0.85, 0.80],  # best 0.85, reaches 0.8 at round 3
    ("iid", "FedSEAL", 1): [0.60, 0.82, 0.83, 0.90],  # best 0.90, reaches 0.8 at round 2
    ("iid", "FedAvg", 0): [0.40, 0.50, 0.60, 0.65],  # never reaches 0.8
    ("iid", "FedAvg", 1): [0.45, 0.55, 0.81, 0.70],  # best 0.81, reaches 0.8 at round 3
    ("noniid", "FedSEAL", 0): [0.30, 0.50, 0.60, 0.70],
    ("noniid", "FedAvg", 0): [0.20, 0.40],  # unfinished: 2 of 4 rounds logged
}
#: method -> (bytes_down, bytes_up) per round
BYTES = {"FedSEAL": (1000.0, 500.0), "FedAvg": (2000.0, 2000.0)}


def write_run(
    run_dir: Path,
    rows: Sequence[Mapping[str, float]],
    *,
    class_path: str = "fedlit.methods.FedSEAL",
    seed: int = 0,
    rounds: int = ROUNDS,
    run_json: Mapping[str, object] | None = None,
) -> Path:
    """A hand-made run directory: config.yaml, metrics.csv (rows as given) and run.json."""
    run_dir.mkdir(parents=True)
    config = {
        "seed_everything": seed,
        "model": {"class_path": class_path, "init_args": {}},
        "data": {"dataset": "fmnist"},
        "federation": {"rounds": rounds, "clients_per_round": 2},
        "trainer": {"accelerator": "cpu"},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    header = sorted({key for row in rows for key in row})
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            writer.writerow([row.get(key, "") for key in header])
    if run_json is not None:
        (run_dir / "run.json").write_text(json.dumps(run_json))
    return run_dir


def synthetic_rows(method: str, accs: Sequence[float]) -> list[dict[str, float]]:
    """Round 0 (partition summary) then one row per accuracy, with bytes and diagnostics."""
    down, up = BYTES[method]
    rows: list[dict[str, float]] = [{"round": 0.0, "partition/R": 0.25, "data/server_labeled": 500}]
    # val/acc: the test curve reversed, so that the round it selects is not the best on test
    for r, (acc, val) in enumerate(zip(accs, accs[::-1], strict=True), start=1):
        row = {"round": float(r), "test/acc": acc, "comm/bytes_down": down, "comm/bytes_up": up}
        row["val/acc"] = val
        if method == "FedSEAL":
            row["pseudo/pos_frac"] = 0.1 * r
        else:
            row["client/mask_rate"] = 0.2 * r
        rows.append(row)
    return rows


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A folder of the ACC runs: FedSEAL names itself in run.json, FedAvg only its setting."""
    root = tmp_path / "sweep"
    for (setting, method, seed), accs in ACC.items():
        meta: dict[str, object] = {"setting": setting}
        if method == "FedSEAL":
            meta |= {"method": method, "seed": seed, "recipe": "recipes/fedseal.yaml"}
        write_run(
            root / setting / f"{method}_s{seed}",
            synthetic_rows(method, accs),
            class_path=f"fedlit.methods.{method}",
            seed=seed if method == "FedAvg" else 99,  # FedSEAL's seed comes from run.json
            run_json=meta,
        )
    return root


def is_png(path: Path) -> bool:
    """Whether ``path`` is a non-empty file starting with the PNG signature."""
    data = path.read_bytes()
    return len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE)


# ----------------------------------------------------------------------------- runs


def test_load_run_takes_identity_from_run_json(sweep: Path) -> None:
    run = load_run(sweep / "iid" / "FedSEAL_s1")
    assert (run.method, run.setting, run.seed, run.rounds) == ("FedSEAL", "iid", 1, ROUNDS)
    assert run.finished
    assert run.summary["partition/R"] == 0.25
    assert run.summary["data/server_labeled"] == 500.0
    assert [row["round"] for row in run.history] == [1.0, 2.0, 3.0, 4.0]
    rounds, values = run.series("test/acc")
    np.testing.assert_array_equal(rounds, [1, 2, 3, 4])
    np.testing.assert_allclose(values, ACC[("iid", "FedSEAL", 1)])


def test_load_run_falls_back_to_config(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path / "run",
        [{"round": 0.0, "partition/R": 0.0}, {"round": 1.0, "test/acc": 0.5}],
        class_path="fedlit.methods.FedMatch",
        seed=7,
        rounds=3,
    )
    run = load_run(str(run_dir))
    assert (run.method, run.setting, run.seed, run.rounds) == ("FedMatch", "default", 7, 3)
    assert run.run_dir == run_dir
    assert not run.finished


def test_load_run_keeps_last_occurrence_of_resumed_rounds(tmp_path: Path) -> None:
    rows = [
        {"round": 0.0, "partition/R": 0.5},
        {"round": 1.0, "test/acc": 0.1, "server/loss": 2.0},
        {"round": 2.0, "server/loss": 1.5},  # not evaluated (eval_every = 2)... then crashed
        {"round": 2.0, "server/loss": 1.4},  # resumed from round 1's checkpoint
        {"round": 3.0, "test/acc": 0.3, "server/loss": 1.2},
        {"round": 1.0, "test/acc": 0.15, "server/loss": 1.9},  # a later duplicate wins
    ]
    run = load_run(write_run(tmp_path / "run", rows, rounds=3))
    assert run.history == [
        {"round": 1.0, "test/acc": 0.15, "server/loss": 1.9},
        {"round": 2.0, "server/loss": 1.4},
        {"round": 3.0, "test/acc": 0.3, "server/loss": 1.2},
    ]
    rounds, values = run.series("test/acc")
    np.testing.assert_array_equal(rounds, [1, 3])
    np.testing.assert_allclose(values, [0.15, 0.3])
    assert run.series("kl/teacher")[0].size == 0
    assert run.finished


def test_load_run_names_missing_files(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [{"round": 1.0, "test/acc": 0.5}])
    (run_dir / "metrics.csv").unlink()
    with pytest.raises(ValueError, match="metrics.csv"):
        load_run(run_dir)
    (run_dir / "config.yaml").unlink()
    with pytest.raises(ValueError, match="config.yaml"):
        load_run(run_dir)


def test_load_run_names_bad_cell_and_missing_rounds(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "bad", [{"round": 1.0, "test/acc": "oops"}])  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"'test/acc'.*'oops'"):
        load_run(run_dir)
    run_dir = write_run(tmp_path / "norounds", [{"round": 1.0}])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    del config["federation"]["rounds"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="federation.rounds"):
        load_run(run_dir)


def test_find_runs_searches_parent_folders_and_sorts(sweep: Path) -> None:
    runs = find_runs([sweep])
    assert [(r.setting, r.method, r.seed) for r in runs] == sorted(ACC)
    # A run directory given directly, and again inside its folder, is read once.
    again = find_runs([sweep / "iid" / "FedAvg_s0", sweep / "iid"])
    assert [(r.method, r.seed) for r in again] == [
        ("FedAvg", 0),
        ("FedAvg", 1),
        ("FedSEAL", 0),
        ("FedSEAL", 1),
    ]


def test_find_runs_raises_when_nothing_found(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match="empty"):
        find_runs([empty])
    with pytest.raises(ValueError, match="missing"):
        find_runs([tmp_path / "missing"])


# ----------------------------------------------------------------------------- table


def rows_by_key(runs: Sequence[RunRecord], target: float | None = TARGET) -> dict:
    """summarize's rows keyed by (setting, method)."""
    return {(row.setting, row.method): row for row in summarize(runs, target=target)}


def test_summarize_matches_numpy_over_seeds(sweep: Path) -> None:
    runs = find_runs([sweep])
    rows = summarize(runs, target=TARGET)
    assert [(row.setting, row.method) for row in rows] == [
        ("iid", "FedAvg"),
        ("iid", "FedSEAL"),
        ("noniid", "FedAvg"),
        ("noniid", "FedSEAL"),
    ]
    by_key = {(row.setting, row.method): row for row in rows}
    for setting, method in [("iid", "FedSEAL"), ("iid", "FedAvg")]:
        row = by_key[(setting, method)]
        curves = [ACC[(setting, method, seed)] for seed in (0, 1)]
        finals = [curve[-1] for curve in curves]
        selected = [curve[int(np.argmax(curve[::-1]))] for curve in curves]
        assert row.seeds == (0, 1)
        assert row.final_mean == pytest.approx(np.mean(finals))
        assert row.final_std == pytest.approx(np.std(finals, ddof=1))
        assert row.selected_mean == pytest.approx(np.mean(selected))
        assert row.selected_std == pytest.approx(np.std(selected, ddof=1))
        assert row.finished == 2
    # Concrete values, so that a wrong ddof or a wrong "final" cannot pass.
    assert by_key[("iid", "FedSEAL")].final_mean == pytest.approx(0.85)
    assert by_key[("iid", "FedSEAL")].final_std == pytest.approx(0.1 / math.sqrt(2))
    single = by_key[("noniid", "FedSEAL")]
    assert single.seeds == (0,)
    assert single.final_mean == pytest.approx(0.70)
    assert math.isnan(single.final_std) and math.isnan(single.selected_std)
    unfinished = by_key[("noniid", "FedAvg")]
    assert unfinished.finished == 0
    assert unfinished.final_mean == pytest.approx(0.40)


def test_selected_by_validation_and_rounds_to_target(sweep: Path) -> None:
    by_key = rows_by_key(find_runs([sweep]))
    seal, avg = by_key[("iid", "FedSEAL")], by_key[("iid", "FedAvg")]
    # val/acc is each test curve reversed: FedSEAL seed 0's val [.80 .85 .70 .50] selects
    # round 2 (test .70), seed 1's [.90 .83 .82 .60] round 1 (test .60)
    assert seal.selected_mean == pytest.approx((0.70 + 0.60) / 2)
    assert avg.selected_mean == pytest.approx((0.40 + 0.55) / 2)
    assert (seal.rounds_to_target, seal.reached) == (pytest.approx(2.5), 2)
    assert (avg.rounds_to_target, avg.reached) == (pytest.approx(3.0), 1)  # seed 0 never does
    nobody = by_key[("noniid", "FedSEAL")]
    assert nobody.reached == 0 and math.isnan(nobody.rounds_to_target)
    for row in summarize(find_runs([sweep]), target=None):
        assert row.reached == 0 and math.isnan(row.rounds_to_target)


def test_bytes_totals(sweep: Path) -> None:
    by_key = rows_by_key(find_runs([sweep]))
    assert by_key[("iid", "FedSEAL")].bytes_total == pytest.approx(ROUNDS * 1500.0)
    assert by_key[("iid", "FedAvg")].bytes_total == pytest.approx(ROUNDS * 4000.0)
    assert by_key[("noniid", "FedAvg")].bytes_total == pytest.approx(2 * 4000.0)


def test_summarize_other_metric(sweep: Path) -> None:
    rows = summarize(find_runs([sweep / "iid"]), metric="pseudo/pos_frac")
    seal = {row.method: row for row in rows}["FedSEAL"]
    assert seal.final_mean == pytest.approx(0.4)
    assert math.isnan({row.method: row for row in rows}["FedAvg"].final_mean)


def test_summarize_rejects_duplicate_seeds(sweep: Path) -> None:
    run = load_run(sweep / "iid" / "FedSEAL_s0")
    with pytest.raises(ValueError, match="FedSEAL_s0"):
        summarize([run, run])


def test_paired_difference_from_baseline_matches_numpy(sweep: Path) -> None:
    rows = {(r.setting, r.method): r for r in summarize(find_runs([sweep]), baseline="FedAvg")}
    seal = rows[("iid", "FedSEAL")]
    diffs = [ACC[("iid", "FedSEAL", s)][-1] - ACC[("iid", "FedAvg", s)][-1] for s in (0, 1)]
    assert seal.delta_seeds == 2
    assert seal.delta_mean == pytest.approx(np.mean(diffs))
    assert seal.delta_std == pytest.approx(np.std(diffs, ddof=1))
    assert seal.delta_mean == pytest.approx(((0.80 - 0.65) + (0.90 - 0.70)) / 2)
    # Non-IID: one common seed (0), against the baseline's last logged value (0.40).
    single = rows[("noniid", "FedSEAL")]
    assert single.delta_seeds == 1 and single.delta_mean == pytest.approx(0.70 - 0.40)
    assert math.isnan(single.delta_std)
    own = rows[("iid", "FedAvg")]
    assert (own.delta_mean, own.delta_std, own.delta_seeds) == (0.0, 0.0, 2)
    for row in summarize(find_runs([sweep])):  # no baseline: nothing compared
        assert row.delta_seeds == 0 and math.isnan(row.delta_mean)
    with pytest.raises(ValueError, match="baseline: no run of method 'ServerSL'"):
        summarize(find_runs([sweep]), baseline="ServerSL")


def test_paired_difference_only_over_seeds_both_have(tmp_path: Path) -> None:
    """A seed the baseline lacks is left out of the difference, not paired with another."""
    for method, seed, acc in [("A", 0, 0.6), ("A", 1, 0.9), ("B", 1, 0.7), ("B", 2, 0.1)]:
        rows = [{"round": 0.0}, {"round": 1.0, "test/acc": acc}]
        meta = {"method": method, "seed": seed, "setting": "s"}
        write_run(tmp_path / f"{method}{seed}", rows, rounds=1, run_json=meta)
    row = {r.method: r for r in summarize(find_runs([tmp_path]), baseline="B")}["A"]
    assert row.delta_seeds == 1 and row.delta_mean == pytest.approx(0.9 - 0.7)


def test_last_k_score_and_paired_interval(tmp_path: Path) -> None:
    """A run's score is the mean of its last k rounds; the paired difference's 95% interval is
    t_{0.975, n-1} std / sqrt(n) over the n seeds, and ``*`` marks one that excludes 0."""
    curves = {
        ("A", 0): [0.50, 0.70, 0.74],
        ("A", 1): [0.52, 0.72, 0.70],
        ("A", 2): [0.51, 0.71, 0.76],
        ("B", 0): [0.40, 0.60, 0.62],
        ("B", 1): [0.41, 0.61, 0.63],
        ("B", 2): [0.42, 0.66, 0.60],
    }
    for (method, seed), accs in curves.items():
        rows = [{"round": 0.0}] + [
            {"round": float(r), "test/acc": a} for r, a in enumerate(accs, start=1)
        ]
        write_run(tmp_path / f"{method}{seed}", rows, rounds=3, run_json={
            "method": method, "seed": seed, "setting": "s"})  # fmt: skip
    rows = {r.method: r for r in summarize(find_runs([tmp_path]), baseline="B", last_k=2)}
    score = {k: np.mean(v[-2:]) for k, v in curves.items()}
    diffs = [score[("A", s)] - score[("B", s)] for s in range(3)]
    a = rows["A"]
    assert a.last_k == 2 and a.score_mean == pytest.approx(
        np.mean([score[("A", s)] for s in range(3)])
    )
    assert a.final_mean == pytest.approx(np.mean([curves[("A", s)][-1] for s in range(3)]))
    assert a.delta_mean == pytest.approx(np.mean(diffs))
    half = 4.303 * np.std(diffs, ddof=1) / np.sqrt(3)  # t_{0.975, 2}
    assert a.delta_ci95 == pytest.approx(half, rel=1e-3)
    assert a.delta_mean - a.delta_ci95 > 0  # significant
    text = to_markdown(list(rows.values()), baseline="B")
    assert "mean of last 2" in text and " *|" in text.replace(" * |", " *|")
    # Student's t 0.975 quantiles as printed in tables (3 decimals)
    assert [round(t_quantile(df), 3) for df in (1, 2, 4, 30, 60, 1000)] == [
        12.706,
        4.303,
        2.776,
        2.042,
        2.0,
        1.962,
    ]
    with pytest.raises(ValueError, match="last_k"):
        summarize(find_runs([tmp_path]), last_k=0)


def test_final_evaluations_over_seeds(tmp_path: Path) -> None:
    evals = {0: (0.70, 0.60), 1: (0.74, 0.66)}  # seed -> (finetune, linear)
    for seed, (finetune, linear) in evals.items():
        rows = [
            {"round": 0.0},
            {"round": 1.0, "test/acc": 0.5},
            {
                "round": 2.0,
                "test/acc": 0.6,
                "eval/finetune_acc": finetune,
                "eval/linear_acc": linear,
            },
        ]
        meta = {"method": "FedSup", "seed": seed, "setting": "iid"}
        write_run(tmp_path / f"fedsup{seed}", rows, rounds=2, run_json=meta)
    write_run(
        tmp_path / "plain",
        [{"round": 0.0}, {"round": 1.0, "test/acc": 0.5}, {"round": 2.0, "test/acc": 0.55}],
        rounds=2,
        run_json={"method": "ServerSL", "seed": 0, "setting": "iid"},
    )
    rows = {r.method: r for r in summarize(find_runs([tmp_path]), baseline="ServerSL")}
    finetunes, linears = zip(*evals.values(), strict=True)
    assert rows["FedSup"].finetune_mean == pytest.approx(np.mean(finetunes))
    assert rows["FedSup"].finetune_std == pytest.approx(np.std(finetunes, ddof=1))
    assert rows["FedSup"].linear_mean == pytest.approx(np.mean(linears))
    assert math.isnan(rows["ServerSL"].finetune_mean)
    text = to_markdown(list(rows.values()), baseline="ServerSL")
    header = (
        "| method | seeds | rounds | final test/acc | vs ServerSL (paired, 95% CI) "
        "| test/acc at best val/acc | rounds to target | MB communicated "
        "| finetune (final eval) | linear (final eval) |"
    )
    assert header in text.splitlines()
    assert (
        "| FedSup | 2 | 2 | 60.00 ± 0.00 | +5.00 | - | - | 0.00 | 72.00 ± 2.83 | 63.00 ± 4.24 |"
    ) in text
    assert "| ServerSL | 1 | 2 | 55.00 | baseline | - | - | 0.00 | - | - |" in text  # no val/acc


def test_to_markdown(sweep: Path) -> None:
    rows = summarize(find_runs([sweep]), target=TARGET)
    published = {"FedSEAL": {"iid": 84.28}}
    text = to_markdown(rows, target=TARGET, published=published)
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("###")] == ["### iid", "### noniid"]
    header = (
        "| method | seeds | rounds | final test/acc | test/acc at best val/acc | rounds to 80% "
        "| MB communicated | paper |"
    )
    assert lines.count(header) == 2
    table_rows = [line for line in lines if line.startswith("| Fed")]
    assert len(table_rows) == 4
    iid_rows = table_rows[:2]  # sorted by final mean, descending: FedSEAL 85.00 > FedAvg 67.50
    assert iid_rows[0] == (
        f"| FedSEAL | 2 | 4 | 85.00 ± {100 * 0.1 / math.sqrt(2):.2f} | 65.00 ± 7.07 | 2.5 (2/2) "
        "| 0.01 | 84.28 |"
    )
    assert iid_rows[1].startswith("| FedAvg | 2 | 4 | 67.50 ± 3.54 | 47.50 ± 10.61 | 3.0 (1/2) |")
    assert iid_rows[1].endswith("|  |")  # no published number for FedAvg
    noniid_rows = table_rows[2:]
    assert noniid_rows[0].startswith("| FedSEAL | 1 | 4 | 70.00 | 30.00 | - (0/1) |")
    assert noniid_rows[1].startswith("| FedAvg | 1 (1 unfinished) | 2 | 40.00 |")
    plain = to_markdown(rows)
    assert "paper" not in plain
    assert "| 2.5 (2/2) |" not in plain and "| - |" in plain


def test_write_csv(sweep: Path, tmp_path: Path) -> None:
    rows = summarize(find_runs([sweep]), target=TARGET)
    path = write_csv(rows, tmp_path / "out" / "results.csv", published={"FedSEAL": {"iid": 84.28}})
    assert path == tmp_path / "out" / "results.csv"
    with path.open(newline="") as f:
        records = list(csv.DictReader(f))
    assert list(records[0]) == [*ResultRow.__dataclass_fields__, "published"]
    assert len(records) == len(rows) == 4
    by_key = {(r["setting"], r["method"]): r for r in records}
    seal = by_key[("iid", "FedSEAL")]
    assert seal["seeds"] == "0 1" and seal["rounds"] == "4 4"
    assert by_key[("noniid", "FedAvg")]["rounds"] == "2"  # unfinished: 2 of 4 rounds
    assert float(seal["final_mean"]) == pytest.approx(85.0)  # percent, as `published`
    assert float(seal["selected_std"]) == pytest.approx(100 * 0.1 / math.sqrt(2))
    assert float(seal["bytes_total"]) == pytest.approx(6000.0)
    assert float(seal["published"]) == pytest.approx(84.28)
    assert by_key[("iid", "FedAvg")]["published"] == ""
    assert math.isnan(float(by_key[("noniid", "FedSEAL")]["final_std"]))
    with write_csv(rows, tmp_path / "plain.csv").open(newline="") as f:
        assert "published" not in next(csv.reader(f))


# ----------------------------------------------------------------------------- plots


def test_plot_curves_and_diagnostics_write_pngs(sweep: Path, tmp_path: Path) -> None:
    runs = find_runs([sweep])
    curves = plot_curves(runs, tmp_path / "figs" / "curves.png")
    assert curves == tmp_path / "figs" / "curves.png" and is_png(curves)
    assert is_png(plot_curves(runs, tmp_path / "loss.png", metric="comm/bytes_up"))
    diagnostics = plot_diagnostics(runs, tmp_path / "diag.png")
    assert diagnostics == tmp_path / "diag.png" and is_png(diagnostics)
    with pytest.raises(ValueError, match="kl/teacher"):
        plot_curves(runs, tmp_path / "none.png", metric="kl/teacher")
    assert not (tmp_path / "none.png").exists()


def test_plot_diagnostics_none_without_diagnostics(tmp_path: Path) -> None:
    rows = [{"round": 0.0}, {"round": 1.0, "test/acc": 0.5, "server/loss": 1.0}]
    run = load_run(write_run(tmp_path / "run", rows, rounds=1))
    assert not any(run.series(key)[0].size for key in DIAGNOSTICS)
    assert plot_diagnostics([run], tmp_path / "diag.png") is None
    assert not (tmp_path / "diag.png").exists()


@pytest.mark.parametrize("shape", [(5, 10), (30, 10)])  # annotated, and too big to annotate
def test_plot_partition_writes_png(tmp_path: Path, shape: tuple[int, int]) -> None:
    counts = np.random.default_rng(0).integers(0, 50, size=shape)
    path = plot_partition(counts, tmp_path / "partition.png", title="Dirichlet(0.1)")
    assert path == tmp_path / "partition.png" and is_png(path)


def test_plot_partition_rejects_bad_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\(10,\)"):
        plot_partition(np.arange(10), tmp_path / "p.png")
    with pytest.raises(ValueError, match="non-negative"):
        plot_partition(-np.ones((2, 2)), tmp_path / "p.png")


def test_reading_runs_needs_no_training_stack() -> None:
    """Run-file names and metric keys come from ``fedlit.run_layout``: importing the reporting
    package loads neither Lightning, torch nor the federation driver."""
    code = (
        "import sys, fedlit.reporting; "
        "print(sorted(m for m in ('lightning', 'torch', 'fedlit.federation', 'fedlit.methods') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_marked_methods_are_marked_in_tables(tmp_path: Path) -> None:
    """A run whose run.json carries marks (the FedAvg-SL oracle's "oracle") is named with
    them in the Markdown table and listed in the CSV's marks column."""
    for method, marks in (("fedavg_sl", ["oracle"]), ("server_sl", [])):
        meta = {"method": method, "seed": 0, "rounds": 2, "marks": marks}
        rows = synthetic_rows("FedAvg", [0.5, 0.6])
        write_run(tmp_path / method, rows, rounds=2, run_json=meta)
    runs = find_runs([tmp_path])
    assert {r.method: r.marks for r in runs} == {"fedavg_sl": ("oracle",), "server_sl": ()}
    rows = summarize(runs)
    text = to_markdown(rows)
    assert "| fedavg_sl (oracle) |" in text and "| server_sl |" in text
    with open(write_csv(rows, tmp_path / "results.csv"), newline="") as f:
        marks = {r["method"]: r["marks"] for r in csv.DictReader(f)}
    assert marks == {"fedavg_sl": "oracle", "server_sl": ""}


def test_summary_names_what_the_intervals_separate(tmp_path: Path) -> None:
    """Under each table, the baseline's score against the target, the oracle's paired
    difference, and the methods whose 95% interval lies above, below or across 0."""
    base = [0.700, 0.710, 0.690]
    offsets = {
        "up": [0.020, 0.030, 0.025],  # clearly above
        "down": [-0.050, -0.040, -0.060],  # clearly below
        "noisy": [0.050, -0.040, 0.010],  # the interval spans 0
        "oracle_m": [0.100, 0.110, 0.090],
    }
    curves = {("B", s): a for s, a in enumerate(base)}
    curves |= {(m, s): base[s] + d for m, ds in offsets.items() for s, d in enumerate(ds)}
    for (method, seed), acc in curves.items():
        marks = ["oracle"] if method == "oracle_m" else []
        meta = {"method": method, "seed": seed, "setting": "s", "marks": marks}
        rows = [{"round": 0.0}, {"round": 1.0, "test/acc": acc}]
        write_run(tmp_path / f"{method}{seed}", rows, rounds=1, run_json=meta)
    rows = summarize(find_runs([tmp_path]), baseline="B")
    text = summary(rows, "B", target=0.695)
    assert "- B: 70.00 ± 1.00 over 3 seeds; its mean reaches 69.5%." in text
    assert "- oracle_m (oracle) vs B: +10.00 ± 1.00 [+7.52, +12.48] *." in text
    assert "- Above B (paired 95% CI): up (+2.50)." in text
    assert "- Below B (paired 95% CI): down (-5.00)." in text
    assert "- Not separated from B (paired 95% CI): noisy (+0.67)." in text
    assert "does not reach 71%" in summary(rows, "B", target=0.71)
    assert text.strip() in to_markdown(rows, target=0.695, baseline="B")
    assert "Above" not in to_markdown(rows)  # no baseline, no summary


def test_the_calibration_verdict_reads_the_oracles_interval(tmp_path: Path) -> None:
    """The rule of docs/comparing.md: calibrated where the oracle's paired 95% interval lies at
    or above the threshold, on the mean only where its mean does but not its lower bound (or
    one seed gives no interval), not calibrated where its mean is below."""
    base = [0.700, 0.710, 0.690]
    oracle = [0.100, 0.110, 0.090]  # +10.00 [+7.52, +12.48]
    for seed in range(3):
        for method, acc in (("B", base[seed]), ("O", base[seed] + oracle[seed])):
            meta = {"method": method, "seed": seed, "setting": "s"}
            meta["marks"] = ["oracle"] if method == "O" else []
            rows = [{"round": 0.0}, {"round": 1.0, "test/acc": acc}]
            write_run(tmp_path / f"{method}{seed}", rows, rounds=1, run_json=meta)
    rows = summarize(find_runs([tmp_path]), baseline="B")
    need = "Calibration (the oracle at least +5 points above the baseline): "
    assert calibration_verdict(rows, 5) == (
        need + "**calibrated**: O's +10.00 [+7.52, +12.48], its whole interval at or above +5."
    )
    assert (
        "**calibrated on the mean only**: O's +10.00 [+7.52, +12.48], the mean at or above "
        "+9 but the interval reaching below it."
    ) in calibration_verdict(rows, 9)
    assert "**not calibrated**: O's +10.00 [+7.52, +12.48] is below +11." in calibration_verdict(
        rows, 11
    )
    one_seed = [replace(r, delta_ci95=math.nan, delta_seeds=1) for r in rows]
    assert "on the mean only**: O's +10.00 is at or above +5, from 1 seed (no interval" in (
        calibration_verdict(one_seed, 5)
    )
    # an interval that crosses 0 is named so (issue 73: +5.67 [-0.88, +12.21] said nothing)
    wide = [replace(r, delta_ci95=0.12) if r.method == "O" else r for r in rows]
    assert (
        "O's +10.00 [-2.00, +22.00], the mean at or above +5 but the interval reaching below "
        "it; its interval includes 0: from these seeds the oracle is not separated from the "
        "baseline."
    ) in calibration_verdict(wide, 5)
    without = [replace(r, marks=()) for r in rows]
    assert "not judged, no oracle row" in calibration_verdict(without, 5)
    text = to_markdown(rows, baseline="B", calibration=5)
    assert "- " + calibration_verdict(rows, 5) in text  # under the setting's table
    assert "Calibration" not in to_markdown(rows, baseline="B")  # only where asked
    from fedlit.cli import main

    out = tmp_path.parent / f"{tmp_path.name}_report"
    main(["report", str(tmp_path), "--baseline=B", "--calibration=5", f"--out={out}"])
    assert calibration_verdict(rows, 5) in (out / "results.md").read_text()


def _flat_run(
    run_dir: Path, seed: int, accs: Sequence[float], method: str = "FedAvg", **changes: object
) -> Path:
    """A run with an hparams.yaml (the flat config the driver logs), as ``fedlit fit`` writes."""
    write_run(run_dir, synthetic_rows(method, accs), class_path=f"fedlit.methods.{method}")
    hparams: dict[str, object] = {
        "seed_everything": seed,
        "model.class_path": f"fedlit.methods.{method}",
        "data.dataset": "fashion_mnist",
        "data.partitioner.class_path": "fedlit.data.partition.IID",
        "federation.rounds": ROUNDS,
        "trainer.default_root_dir": str(run_dir),
        "trainer.logger": False,
        "data.root": "data",
        "model.init_args.optim.client_lr": 0.03,
        **changes,
    }
    (run_dir / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    (run_dir / "run.json").write_text(json.dumps({"seed": seed}))
    return run_dir


def _report(*paths: Path, out: Path, baseline: str | None = None) -> list[dict[str, str]]:
    """``fedlit report`` of ``paths`` in a process of its own; the rows of its results.csv."""
    argv = [sys.executable, "-m", "fedlit.cli", "report", *map(str, paths), "--out", str(out)]
    done = subprocess.run(
        argv + ([f"--baseline={baseline}"] if baseline else []), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    with (out / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


#: A data set's keys in a flat config: its name and the classes it links into the network.
FMNIST = {"data.dataset": "fashion_mnist", "model.init_args.network.num_classes": 10}
FOLDER = {"data.dataset": "folder", "model.init_args.network.num_classes": 5}


def test_runs_of_two_data_sets_are_two_rows_with_their_own_means(tmp_path: Path) -> None:
    """Runs of one method on two data sets are two rows, each the mean over its own seeds and
    labelled by the keys they differ in, shortly, each in a table of its own."""
    runs = [
        _flat_run(tmp_path / "fm0", 0, [0.5, 0.6, 0.7, 0.8], **FMNIST),
        _flat_run(tmp_path / "fm1", 1, [0.5, 0.6, 0.7, 0.9], **FMNIST),
        _flat_run(tmp_path / "folder0", 0, [0.2, 0.3, 0.4, 0.4], **FOLDER),
        _flat_run(tmp_path / "folder1", 1, [0.2, 0.3, 0.4, 0.6], **FOLDER),
    ]
    rows = {row.setting: row for row in summarize(find_runs(runs))}
    fmnist = "default [data.dataset=fashion_mnist, network.num_classes=10]"
    folder = "default [data.dataset=folder, network.num_classes=5]"
    assert list(rows) == [fmnist, folder]
    assert rows[fmnist].seeds == (0, 1) and rows[fmnist].final_mean == pytest.approx(0.85)
    assert rows[folder].seeds == (0, 1) and rows[folder].final_mean == pytest.approx(0.5)
    assert rows[folder].final_std == pytest.approx(np.std([0.4, 0.6], ddof=1))
    headings = [line for line in to_markdown(list(rows.values())).splitlines() if "###" in line]
    assert sorted(headings) == [f"### {fmnist}", f"### {folder}"]

    records = _report(tmp_path, out=tmp_path / "report")
    assert {(r["setting"], r["seeds"]) for r in records} == {(fmnist, "0 1"), (folder, "0 1")}
    assert (tmp_path / "report" / "results.md").read_text().count("### default [") == 2


def test_the_baseline_pairs_with_its_runs_of_the_same_data_set(tmp_path: Path) -> None:
    """A row's paired difference is against the baseline's runs of its own data set; where
    the baseline did not run that data set, the row is not paired. A baseline that ran one
    data set is labelled with it, in that data set's table."""
    for seed, (fm, fo) in enumerate([(0.80, 0.50), (0.90, 0.60)]):
        _flat_run(tmp_path / f"a_fm{seed}", seed, [fm], **FMNIST)
        _flat_run(tmp_path / f"a_folder{seed}", seed, [fo], **FOLDER)
        base = [fm - 0.1 * (seed + 1)]  # 0.1 and 0.2 below FedAvg's
        _flat_run(tmp_path / f"b_fm{seed}", seed, base, method="FedSEAL", **FMNIST)
    rows = {(r.setting, r.method): r for r in summarize(find_runs([tmp_path]), baseline="FedSEAL")}
    fmnist = "default [data.dataset=fashion_mnist, network.num_classes=10]"
    folder = "default [data.dataset=folder, network.num_classes=5]"
    assert set(rows) == {(fmnist, "FedAvg"), (folder, "FedAvg"), (fmnist, "FedSEAL")}
    paired = rows[(fmnist, "FedAvg")]
    assert paired.delta_seeds == 2 and paired.delta_mean == pytest.approx((0.1 + 0.2) / 2)
    alone = rows[(folder, "FedAvg")]
    assert alone.delta_seeds == 0 and math.isnan(alone.delta_mean)
    assert alone.final_mean == pytest.approx(0.55)


def test_runs_that_agree_but_for_placement_are_seeds_of_one_row(tmp_path: Path) -> None:
    """Runs differing only in the seed, the run directory, the loggers and the data root are
    seeds of one row, labelled by the setting alone, as before."""
    one = _flat_run(tmp_path / "try1", 1, [0.5, 0.6, 0.7, 0.8])
    two = _flat_run(
        tmp_path / "try2", 2, [0.6, 0.7, 0.8, 0.9], **{"trainer.logger": True, "data.root": "x"}
    )
    (row,) = summarize(find_runs([one, two]))
    assert row.setting == "default" and row.seeds == (1, 2)
    assert row.final_mean == pytest.approx(0.85)


def test_a_partitioner_and_a_rate_apart_are_rows_named_by_both(tmp_path: Path) -> None:
    """An IID run and a Dirichlet run of one method at another client_lr are two rows; the
    label names the partitioner by its class and both keys, shortly."""
    iid = _flat_run(tmp_path / "iid", 0, [0.5, 0.6, 0.7, 0.8])
    noniid = _flat_run(
        tmp_path / "noniid",
        0,
        [0.3, 0.4, 0.5, 0.5],
        **{
            "data.partitioner.class_path": "fedlit.data.partition.Dirichlet",
            "data.partitioner.init_args.alpha": 0.1,
            "model.init_args.optim.client_lr": 0.01,
        },
    )
    rows = {row.setting: row for row in summarize(find_runs([iid, noniid]))}
    assert set(rows) == {
        "default [data.partitioner=IID, optim.client_lr=0.03]",
        "default [data.partitioner=Dirichlet, optim.client_lr=0.01]",
    }
    noniid_row = rows["default [data.partitioner=Dirichlet, optim.client_lr=0.01]"]
    assert noniid_row.seeds == (0,) and noniid_row.final_mean == pytest.approx(0.5)


def test_rows_give_the_rounds_their_runs_ran(tmp_path: Path) -> None:
    """A row's rounds are each run's last logged round; the table gives one number, or the
    lowest and highest where its runs differ; the CSV each run's."""
    done = _flat_run(tmp_path / "done", 0, [0.5, 0.6, 0.7, 0.8])
    cut = _flat_run(tmp_path / "cut", 1, [0.5, 0.7])  # stopped after 2 of 4 rounds
    other = _flat_run(tmp_path / "other", 0, [0.5, 0.6, 0.7, 0.8], method="FedSEAL")
    rows = {row.method: row for row in summarize(find_runs([done, cut, other]))}
    assert rows["FedAvg"].rounds == (4, 2) and rows["FedSEAL"].rounds == (4,)
    text = to_markdown(list(rows.values()))
    assert "| method | seeds | rounds | final test/acc |" in text
    assert "| FedAvg | 2 (1 unfinished) | 2-4 | 75.00 ± 7.07 |" in text
    assert "| FedSEAL | 1 | 4 | 80.00 |" in text
    records = _report(done, cut, other, out=tmp_path / "report")
    assert {r["method"]: r["rounds"] for r in records} == {"FedAvg": "4 2", "FedSEAL": "4"}


def test_two_runs_of_one_seed_and_config_are_refused_naming_both(tmp_path: Path) -> None:
    """Two runs of one method, seed and config (apart from placement) would count the seed
    twice: refused naming both directories, before anything is written."""
    first = _flat_run(tmp_path / "first", 0, [0.5, 0.6, 0.7, 0.8])
    again = _flat_run(tmp_path / "again", 0, [0.5, 0.6, 0.7, 0.9], **{"trainer.logger": True})
    with pytest.raises(ValueError, match="counted twice") as err:
        summarize(find_runs([first, again]))
    assert str(first) in str(err.value) and str(again) in str(err.value)
    out = tmp_path / "report"
    argv = [sys.executable, "-m", "fedlit.cli", "report", str(first), str(again), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 2 and "counted twice" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_partition_heat_map_is_anchored_at_zero_with_class_names(tmp_path: Path) -> None:
    """An even split (6 or 7 images a cell) reads as even: the colour scale starts at 0, not at
    the smallest count; the columns carry the data set's class names."""
    from fedlit.data.datasets import dataset_spec

    names = dataset_spec("fashion_mnist").classes
    assert names is not None and names[0] == "T-shirt/top" and names[9] == "Ankle boot"
    counts = np.array([[6, 7] * 5, [7, 6] * 5])
    seen: dict[str, object] = {}

    def inspect(fig: object) -> None:
        ax = fig.axes[0]  # type: ignore[attr-defined]
        seen["clim"] = ax.images[0].get_clim()
        seen["ticks"] = [t.get_text() for t in ax.get_xticklabels()]

    path = plot_partition(counts, tmp_path / "p.png", "IID", names, inspect=inspect)
    assert is_png(path)
    assert seen == {"clim": (0.0, 7.0), "ticks": list(names)}
    with pytest.raises(ValueError, match="class_names: 9 names for 10 classes"):
        plot_partition(counts, tmp_path / "q.png", class_names=names[:9])
    with pytest.raises(ValueError, match=r"client_names: 1 names for 2 clients \(rows\)"):
        plot_partition(counts, tmp_path / "q.png", client_names=["alice"])


def test_curves_in_percent_and_one_seed_in_the_singular(sweep: Path, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    seen: list[list[tuple[str, str, float]]] = []
    original = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        seen.append(
            [(ax.get_title(), ax.get_ylabel(), ax.lines[0].get_ydata().max()) for ax in self.axes]
        )
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", keep)
        plot_curves(find_runs([sweep]), tmp_path / "c.png")
    (panels,) = seen
    titles = {title for title, _, _ in panels}
    assert titles == {"iid (mean ± std over n=2 seeds)", "noniid (mean ± std over n=1 seed)"}
    assert {label for _, label, _ in panels} == {"test/acc (%)"}
    # iid's first line, FedAvg: the mean of [.40 .50 .60 .65] and [.45 .55 .81 .70] peaks at
    # round 3, (.60 + .81) / 2 = 70.5%
    iid = next(p for p in panels if p[0].startswith("iid"))
    assert iid[2] == pytest.approx(70.5)


def test_report_of_runs_without_rounds_is_refused_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose metrics.csv holds its header only (a fit in its first round): ``fedlit
    report`` refuses it by name, status 2 in one line, and writes nothing; beside a run with
    rounds it is reported with a warning."""
    from conftest import refused

    from fedlit.cli import main

    empty = write_run(tmp_path / "empty", [])
    (empty / "metrics.csv").write_text("round,test/acc\n")  # the header only
    out = tmp_path / "rep"
    err = refused(["report", str(empty), f"--out={out}"], capsys)
    assert len(err.strip().splitlines()) == 1
    assert str(empty) in err and "no round logged yet" in err
    assert not out.exists()
    done = write_run(tmp_path / "done", synthetic_rows("FedSEAL", [0.5, 0.6, 0.7, 0.8]), seed=1)
    main(["report", str(empty), str(done), f"--out={out}"])
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, err  # no --last_k warning of its 0 rounds besides
    assert "1 run(s) logged no round yet" in warnings[0]
    assert (out / "results.md").is_file()


def _budget_run(
    root: Path,
    method: str,
    seed: int,
    stages: Sequence[str],
    contributed: Sequence[float],
    bootstrap: int = 0,
    source: Mapping[str, object] | None = None,
) -> Path:
    """A run of 3 rounds whose server trains ``stages`` each round (2 epochs each, 25 labels
    in batches of 10: 2 steps an epoch), with ``bootstrap`` epochs before round 1, its clients'
    ``client/contributed`` each round, and a warm start's ``source``."""
    row0: dict[str, float] = {"round": 0.0, "data/server_labeled": 25.0}
    if bootstrap:
        row0["bootstrap/acc"] = 0.5
    rows = [row0]
    for r, share in enumerate(contributed, start=1):
        row = {"round": float(r), "test/acc": 0.5, "client/contributed": share}
        rows.append(
            row | {f"{stage}/loss": 1.0 for stage in stages} | {"client/mask_rate": share / 10}
        )
    meta: dict[str, object] = {"method": method, "seed": seed}
    if source is not None:
        meta["init_from"] = dict(source)
    run_dir = write_run(root / f"{method}_s{seed}", rows, rounds=3, run_json=meta)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["model"]["init_args"] = {"bootstrap_epochs": bootstrap}
    config["data"]["batch_size"] = 10
    config["federation"]["server_epochs"] = 2
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def test_flags_name_a_server_budget_and_silent_clients(tmp_path: Path) -> None:
    """A row is flagged where its clients contributed nothing in at least half its rounds, or
    where its server's epochs, steps or warm start differ from the baseline's: FedAvg's
    server step and fine-tune, 3 rounds x 2 x 2 epochs = 12 epochs of 2 steps; FedSEAL's
    bootstrap of 6 and 3 x 2 = 12 (equal: unflagged); a bootstrap of 4 (10 epochs); a warm
    start."""
    both, one = ("server", "finetune"), ("server",)
    source = {"path": "/a/last.ckpt", "sha256": "ab" * 32, "method": "ServerSL", "round": 9}
    for seed in (0, 1):
        _budget_run(tmp_path, "FedAvg", seed, both, [0.0, 0.0, 0.5])  # silent 2 of 3
        _budget_run(tmp_path, "FedSEAL", seed, one, [1.0, 0.0, 1.0], bootstrap=6)
        _budget_run(tmp_path, "Short", seed, one, [1.0, 1.0, 1.0], bootstrap=4)
        _budget_run(tmp_path, "Warm", seed, both, [1.0, 1.0, 1.0], source=source)
    runs = find_runs([tmp_path])
    rows = {row.method: row for row in summarize(runs, baseline="FedAvg")}
    assert rows["FedAvg"].flags == ("clients contributed nothing in 4/6 rounds",)
    assert (rows["FedAvg"].server_epochs, rows["FedAvg"].server_steps) == (12.0, 24.0)
    assert rows["FedSEAL"].flags == ()  # 6 + 3 x 2 = 12 epochs: the baseline's budget
    assert rows["FedSEAL"].bootstrap_epochs == 6.0 and rows["FedSEAL"].silent_rounds == 2
    assert rows["Short"].flags == ("server budget: 10 epochs (bootstrap 4) vs 12 epochs",)
    assert rows["Warm"].flags == ("server budget: 12 epochs vs 12 epochs, another warm start",)
    assert rows["Warm"].warm_start == "ServerSL round 9"
    assert rows["Warm"].client_activity == pytest.approx(0.1)
    # in percent in the CSV, as in the table and on W&B (once 0.1 beside W&B's 10)
    with open(write_csv(list(rows.values()), tmp_path / "results.csv"), newline="") as f:
        shares = {r["method"]: float(r["client_activity"]) for r in csv.DictReader(f)}
    columns, cells = wandb_table(list(rows.values()))
    logged = {c[columns.index("method")]: c[columns.index("client_activity")] for c in cells}
    assert shares["Warm"] == pytest.approx(10.0) == logged["Warm"]
    text = to_markdown(list(rows.values()), baseline="FedAvg")
    assert "| FedSEAL | 12 (bootstrap 6 + 3 x 2) | 24 | - | 2/6 | 6.7% |" in text
    assert "| FedAvg | 12 (6 x 2) | 24 | - | 4/6 | 1.7% |" in text  # (0 + 0 + 0.05) / 3
    # without a baseline, a row is set against the other rows of its table
    alone = {row.method: row for row in summarize(runs)}
    assert alone["FedSEAL"].flags == (
        "server budget: 12 epochs (bootstrap 6) vs 10 epochs (bootstrap 4)",
    )
    assert [row.flags for row in summarize([r for r in runs if r.method == "FedSEAL"])] == [()]


def test_gains_are_shares_of_the_headroom_and_a_protocol_without_it_says_so(
    tmp_path: Path,
) -> None:
    """A table with the joint centralized reference gives each gain as a share of the
    reference's and of the oracle's beside the points, and the calibration verdict's second
    rule (docs/comparing.md) says when the reference gains less than +8 points."""
    base = [0.700, 0.710, 0.690]
    offsets = {
        "O": [0.100, 0.110, 0.090],  # the oracle: +10
        "centralized_fixmatch_joint": [0.040, 0.045, 0.035],  # +4: no headroom
        "M": [0.020, 0.025, 0.015],  # +2: 50% of the reference's, 20% of the oracle's
    }
    curves = {("B", s): a for s, a in enumerate(base)}
    curves |= {(m, s): base[s] + d for m, ds in offsets.items() for s, d in enumerate(ds)}
    for (method, seed), acc in curves.items():
        marks = {"O": ["oracle"], "centralized_fixmatch_joint": ["centralized"]}.get(method, [])
        meta = {"method": method, "seed": seed, "setting": "s", "marks": marks}
        history = [{"round": 0.0}, {"round": 1.0, "test/acc": acc}]
        write_run(tmp_path / f"{method}{seed}", history, rounds=1, run_json=meta)
    rows = summarize(find_runs([tmp_path]), baseline="B")
    by = {r.method: r for r in rows}
    joint, oracle = headroom_shares(by["M"], rows)
    assert (round(joint, 6), round(oracle, 6)) == (0.5, 0.2)
    text = to_markdown(rows, baseline="B", calibration=5)
    assert "| share of centralized_fixmatch_joint / oracle gain |" in text
    assert "+2.00 ± 0.50 [+0.76, +3.24] * | 50% / 20% |" in text
    assert "| 250% / 100% |" in text  # the oracle's own row
    verdict = headroom_verdict(rows)
    assert verdict.startswith(
        "Semi-supervised headroom (centralized_fixmatch_joint at least +8 points above the "
        "baseline, its interval's low end at +5 or more): **no semi-supervised headroom**: "
        "+4.00 [+2.76, +5.24] is below +8."
    )
    assert "- " + verdict in text  # under the table, beside the oracle's rule
    roomy = [replace(r, delta_mean=3 * r.delta_mean, delta_ci95=r.delta_ci95) for r in rows]
    assert "**room to help**: +12.00 [+10.76, +13.24]." in headroom_verdict(roomy)
    wide = [replace(r, delta_mean=2.25 * r.delta_mean, delta_ci95=5 * r.delta_ci95) for r in rows]
    assert "**room on the mean only**: +9.00 [+2.79, +15.21], its low end below +5" in (
        headroom_verdict(wide)
    )
    without = [r for r in rows if r.method != "centralized_fixmatch_joint"]
    assert "not judged, no centralized_fixmatch_joint row" in headroom_verdict(without)
    assert "share of" not in to_markdown(without, baseline="B")  # only with the reference


def test_fewer_than_three_seeds_or_a_zero_spread_give_no_interval_star_or_side(
    tmp_path: Path,
) -> None:
    """Two seeds with the same difference once read ``+0.25 ± 0.00 [+0.25, +0.25] *`` and
    "Above", one seed "Not separated": no interval, no star and no side, and the note says
    why under the table."""
    from fedlit.reporting.table import NO_INTERVAL

    for seeds, offsets in ((2, [0.0025, 0.0025]), (1, [0.0025])):
        folder = tmp_path / f"s{seeds}"
        for seed in range(seeds):
            for method, acc in (("B", 0.7 + seed / 100), ("M", 0.7 + seed / 100 + offsets[seed])):
                meta = {"method": method, "seed": seed, "setting": "s", "marks": []}
                rows = [{"round": 0.0}, {"round": 1.0, "test/acc": acc}]
                write_run(folder / f"{method}{seed}", rows, rounds=1, run_json=meta)
        rows = summarize(find_runs([folder]), baseline="B")
        text = to_markdown(rows, baseline="B")
        row = next(line for line in text.splitlines() if line.startswith("| M |"))
        assert "+0.25" in row and "[" not in row and "*" not in row, row
        assert "Above B" not in text and "Not separated" not in text, text
        assert "- Not sorted against B: M (+0.25)." in text
        assert NO_INTERVAL[1:] in text


def test_a_rerun_logs_the_results_into_the_same_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B once got a new ``<name>/results`` run at each re-run of a finished comparison."""
    import wandb

    from fedlit.comparison.report import log_to_wandb

    calls, init = recording_wandb_init(tmp_path)
    monkeypatch.setattr(wandb, "init", init)
    write_run(tmp_path / "r", synthetic_rows("FedAvg", [0.5, 0.6]), rounds=2)
    runs = find_runs([tmp_path])
    for _ in range(2):
        log_to_wandb(runs, {}, "proj", "cmp", True, tmp_path / "out")
    log_to_wandb(runs, {}, "proj", "cmp", True, tmp_path / "other")
    ids = [call["id"] for call in calls]
    assert ids[0] == ids[1] != ids[2] and calls[0]["resume"] == "allow"


def test_diagnostics_that_are_fractions_are_plotted_in_percent(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the tables give them: FedAvg's mask rate 0.2 a round is 20%, once 0.2 beside a
    table in percent."""
    from fedlit.reporting import plots

    saved: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or Path(path))
    plot_diagnostics(find_runs([sweep]), tmp_path / "diag.png")
    axes = {ax.get_title(): ax for ax in saved[0].axes if ax.get_title()}
    assert "client/mask_rate (%)" in axes and "pseudo/pos_frac (%)" in axes
    first = min(line.get_ydata()[0] for line in axes["client/mask_rate (%)"].get_lines())
    assert first == pytest.approx(20.0)
