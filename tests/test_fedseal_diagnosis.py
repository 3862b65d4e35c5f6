"""benchmarks/fedseal_diagnosis.py on a tiny setting: its runs, its report, its checks."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import pytest
from conftest import load_script, tiny_overrides

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "fedseal_diagnosis.py"


def _script() -> ModuleType:
    return load_script(SCRIPT)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if row["round"] != "0"]


def test_diagnosis_runs_the_ablations_and_reports_their_rows(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    out = tmp_path / "diag"
    argv = [
        "--seeds",
        "0",
        "--ablations",
        "no_negative_learning",
        "--baselines",
        "server_sl_matched",
        "--last_k",
        "2",
        f"--out={out}",
        f"--report={tmp_path / 'docs' / 'fedseal.md'}",
        "--fedseal_overrides=--model.init_args.bootstrap_epochs=1",
        "--",
        *tiny_overrides(fmnist_root, rounds=2),
    ]
    written = script.main(argv)
    text = written.read_text()
    assert (tmp_path / "docs" / "fedseal.md").read_text() == text
    assert "4 runs (4 new, 0 resumed, 0 finished before" in text
    # the FedSEAL runs got their own override, Server-SL did not (it would refuse it)
    full = _rows(out / "full" / "seed0")
    ablation = _rows(out / "no_negative_learning" / "seed0")
    base = _rows(out / "server_sl" / "seed0")
    assert "pseudo/pos_frac" in full[0] and "pseudo/pos_frac" not in base[0]
    assert all(float(row["pseudo/neg_frac"]) == 0.0 for row in ablation)
    # the matched lower bound: Server-SL with (2 rounds x 1 epoch + 1 bootstrap epoch) / 2
    # rounds, rounded: 2 server epochs a round, so 2 x the batches of server_sl's rounds
    matched = _rows(out / "server_sl_matched" / "seed0")
    assert "pseudo/pos_frac" not in matched[0]
    config = (out / "server_sl_matched" / "seed0" / "config.yaml").read_text()
    assert "server_epochs: 2" in config
    # scores: the mean of the last 2 rounds' test/acc of each run, as the runs logged them
    named = (
        ("server_sl", base),
        ("full", full),
        ("no_negative_learning", ablation),
        ("server_sl_matched", matched),
    )
    for name, rows in named:
        score = 100 * sum(float(r["test/acc"]) for r in rows[-2:]) / 2
        line = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert line.split(" | ")[2].startswith(f"{score:.2f} ± nan"), line
    # the per-round table of the full run: its logged accuracy, lambda and thresholds
    table = text.split("## Per round: full")[1].split("## ")[0]
    for row in full:
        cells = next(
            line
            for line in table.splitlines()
            if line.startswith(f"| {int(float(row['round']))} |")
        ).split(" | ")
        assert cells[1] == f"{100 * float(row['test/acc']):.1f}"
        assert cells[7] == f"{float(row['fedseal/lambda']):.3f}"
        taus = [f"{float(row[f'fedseal/tau_{m}']):.2f}" for m in range(10)]
        assert [c.strip(" |") for c in cells[8:]] == taus
    # a second invocation finds every run finished and runs nothing
    capsys.readouterr()
    again = script.main(argv).read_text()
    assert "4 runs (0 new, 0 resumed, 4 finished before" in again


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ablations", "no_such_thing"], "--ablations"),
        (["--baselines", "no_such_thing"], "--baselines"),
        (["--preface", "docs/none.md"], "--preface"),
        (["--recipe", "recipes/none.yaml"], "--recipe"),
        (["--", "--federation.rounds=-1"], "rounds"),
    ],
)
def test_diagnosis_refuses_bad_input_before_any_run(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    out = tmp_path / "diag"
    with pytest.raises(SystemExit) as exc:
        script.main([f"--out={out}", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_ablation_overrides_follow_the_recipe() -> None:
    """The relative ablations scale the recipe's own values: 3 x 2 local epochs, 0.03 / 3 and
    0.03 x 3 for the client learning rate, 2 x 12 rounds; the others are fixed values."""
    script = _script()
    config = {
        "federation": {"local_epochs": 2, "server_epochs": 10, "rounds": 12},
        "model": {"init_args": {"optim": {"client_lr": 0.03, "server_lr": 0.03}}},
    }
    made = {name: make(config) for name, (_, make) in script.ABLATIONS.items()}
    assert made["local_epochs_x3"] == ["--federation.local_epochs=6"]
    assert made["client_lr_div3"] == ["--model.init_args.optim.client_lr=0.01"]
    assert made["client_lr_x3"] == ["--model.init_args.optim.client_lr=0.09"]
    assert made["rounds_x2"] == ["--federation.rounds=24"]
    assert made["server_lr_div3"] == ["--model.init_args.optim.server_lr=0.01"]
    assert made["server_epochs_1"] == ["--federation.server_epochs=1"]
    assert made["full"] == []
    assert made["no_bootstrap"] == ["--model.init_args.bootstrap_epochs=0"]
    assert made["no_self_ensemble"] == ["--model.init_args.self_ensemble=false"]


def test_server_sl_variants_match_the_fedseal_run() -> None:
    """The matched lower bound trains the server FedSEAL's epochs in all: 12 rounds x 2 + a
    10-epoch bootstrap = 34 epochs, 34 / 12 = 2.83 -> 3 a round; at 200 rounds, 410 / 200 =
    2.05 -> 2. The x2 variant doubles the epochs a round (FixMatch's server training)."""
    script = _script()
    config = {
        "federation": {"server_epochs": 2, "rounds": 12},
        "model": {"init_args": {"bootstrap_epochs": 10}},
    }
    made = {name: make(config) for name, (_, make) in script.BASELINE_VARIANTS.items()}
    assert made["server_sl_matched"] == ["--federation.server_epochs=3"]
    assert made["server_sl_x2"] == ["--federation.server_epochs=4"]
    assert made["server_sl_1_epoch"] == ["--federation.server_epochs=1"]
    config["federation"]["rounds"] = 200
    assert script.BASELINE_VARIANTS["server_sl_matched"][1](config) == [
        "--federation.server_epochs=2"
    ]
