"""``fedlit compare``/``report``/``partition`` through the real CLI, W&B offline, resume."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import refused, tiny_overrides, wandb_records

from fedlit.cli import main
from fedlit.comparison import Comparison, execute, plan, run_state
from fedlit.federation.callbacks import RunFile
from fedlit.federation.checkpoint import save_checkpoint
from fedlit.federation.config import FederationConfig
from fedlit.methods import ServerSL
from fedlit.models import Architecture

REPO = Path(__file__).parents[1]


def _tiny(root: Path) -> list[str]:
    return tiny_overrides(root, rounds=2, test_subset=200)


def _spec(tmp_path: Path, root: Path, **extra: object) -> Path:
    spec = {
        "name": "tiny",
        "out": str(tmp_path / "out"),
        "recipes": [
            str(REPO / "recipes/server_sl.yaml"),
            str(REPO / "recipes/fedavg_fixmatch.yaml"),
        ],
        "seeds": [0, 1],
        "overrides": _tiny(root),
        "target": 0.2,
        "published": {"server_sl": {"default": 80.25}},
        **extra,
    }
    path = tmp_path / "comparison.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_compare_two_recipes_two_seeds(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "docs" / "tiny.md"
    spec = _spec(
        tmp_path,
        fmnist_root,
        report=str(report),
        description=["Tiny protocol."],
        baseline="server_sl",
    )
    main(["compare", f"--config={spec}"])
    written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = tmp_path / "out"
    for name in ("csv", "markdown", "curves", "partition_default", "report"):
        assert Path(written[name]).is_file(), name
    rows = _csv(out / "tiny.csv")  # out's report files are named after the comparison
    assert {Path(written[k]) for k in ("csv", "markdown", "curves")} == {
        out / "tiny.csv",
        out / "tiny.md",
        out / "tiny_curves.png",
    }
    assert sorted(r["method"] for r in rows) == ["fedavg_fixmatch", "server_sl"]
    for row in rows:  # the mean over seeds is the mean of each seed's final test/acc
        finals = []
        for seed in (0, 1):
            run = _csv(out / "default" / row["method"] / f"seed{seed}" / "metrics.csv")
            finals.append(float(run[-1]["test/acc"]))
            info = json.loads(
                (out / "default" / row["method"] / f"seed{seed}" / "run.json").read_text()
            )
            assert info["seed"] == seed and info["setting"] == "default"
        assert float(row["final_mean"]) == pytest.approx(100 * np.mean(finals))  # percent
        assert float(row["final_std"]) == pytest.approx(100 * np.std(finals, ddof=1))
    by_method = {row["method"]: row for row in rows}

    def final(method: str, seed: int) -> float:
        return float(_csv(out / "default" / method / f"seed{seed}" / "metrics.csv")[-1]["test/acc"])

    diffs = [final("fedavg_fixmatch", seed) - final("server_sl", seed) for seed in (0, 1)]
    delta = by_method["fedavg_fixmatch"]
    assert float(delta["delta_mean"]) == pytest.approx(100 * np.mean(diffs))
    assert float(delta["delta_std"]) == pytest.approx(100 * np.std(diffs, ddof=1))
    text = report.read_text()
    assert "fedlit compare" in text and "80.25" in text and "Tiny protocol." in text
    assert "4 runs (4 new, 0 resumed, 0 finished before;" in text  # not "4 run"
    assert "| vs server_sl (paired, 95% CI) |" in text and "| baseline |" in text
    assert (report.parent / "tiny_curves.png").is_file()  # the report's plots travel with it


def test_compare_skips_finished_and_resumes_interrupted(tmp_path: Path) -> None:
    """execute() on prepared run directories, with a fit that only records its arguments."""
    recipe = REPO / "recipes/server_sl.yaml"
    comparison = Comparison(name="c", recipes=[str(recipe)], seeds=[0, 1, 2, 3], out=str(tmp_path))
    runs = plan(comparison)
    finished, interrupted, broken, new = runs
    save_checkpoint(finished.run_dir / "checkpoints" / "last.ckpt", {"round": 3})
    save_checkpoint(interrupted.run_dir / "checkpoints" / "last.ckpt", {"round": 1})
    broken.run_dir.mkdir(parents=True)
    (broken.run_dir / "metrics.csv").write_text("round\n0\n")
    assert [run_state(r, 3) for r in runs] == ["finished", "resumable", "broken", "new"]
    calls: list[list[str]] = []
    counts = execute(runs, dict.fromkeys(runs, 3), calls.append, log=lambda _: None)
    assert counts == {"run": 2, "resumed": 1, "skipped": 1}
    assert len(calls) == 3
    assert any(a.startswith("--federation.resume=") for a in calls[0])  # the interrupted run
    assert not any(a.startswith("--federation.resume=") for c in calls[1:] for a in c)
    kept = broken.run_dir.with_name(broken.run_dir.name + ".incomplete1")
    assert (kept / "metrics.csv").read_text() == "round\n0\n"  # set aside, never deleted


def test_a_resumed_run_keeps_what_its_run_json_recorded(tmp_path: Path) -> None:
    """run.json has one writer, the run (RunFile): a comparison names each run by its
    ``federation.labels`` (the recipe's name as its method, the setting, the recipe), which
    the run writes beside what it knows itself. A warm-started run records its source when
    it starts; a resume does not read the source again, so the resumed run keeps that record
    (and is named again); a record that cannot be read is written anew."""
    recipe = REPO / "recipes/server_sl.yaml"
    comparison = Comparison(name="c", recipes=[str(recipe)], seeds=[0, 1], out=str(tmp_path))
    interrupted, new = plan(comparison)
    labels = {"method": "server_sl", "setting": "default", "recipe": str(recipe)}
    calls: list[list[str]] = []
    counts = execute([interrupted, new], dict.fromkeys([interrupted, new], 3), calls.append)
    assert counts == {"run": 2, "resumed": 0, "skipped": 0}
    assert calls[0] == ["fit", *interrupted.args, f"--federation.labels={json.dumps(labels)}"]
    assert not (interrupted.run_dir / "run.json").exists()  # the comparison writes none

    budget = {"epochs_per_step": 1, "bootstrap_epochs": 0, "batches_per_epoch": 1}

    def start(run_dir: Path, seed: int, source: Any = None) -> dict[str, Any]:
        config = FederationConfig(rounds=3, labels=labels)
        view = SimpleNamespace(
            method=ServerSL(Architecture(10, 1)),
            run_dir=run_dir,
            seed=seed,
            config=config,
            source=source,
            server_budget=budget,
        )
        RunFile().on_run_start(view)  # type: ignore[arg-type]
        return dict(json.loads((run_dir / "run.json").read_text()))

    source = {"path": "/a/plateau/last.ckpt", "sha256": "ab" * 32, "round": 1}
    interrupted.run_dir.mkdir(parents=True)
    recorded = {"method": "old", "seed": 0, "rounds": 2, "init_from": source}
    (interrupted.run_dir / "run.json").write_text(json.dumps(recorded))
    resumed = start(interrupted.run_dir, 0)
    recorded = {**labels, "seed": 0, "rounds": 3, "marks": [], "server_budget": budget}
    assert resumed == recorded | {"init_from": source}
    new.run_dir.mkdir(parents=True)
    (new.run_dir / "run.json").write_text("{not json")
    assert start(new.run_dir, 1) == recorded | {"seed": 1}


def test_compare_in_parallel_processes_matches_one_process(
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jobs: 2 runs each ``fedlit fit`` in its own process with cores // 2 torch threads, its
    output in <out>/logs; each run's numbers are those of the in-process run (one thread)."""
    recipe = [str(REPO / "recipes/server_sl.yaml")]
    specs = {}
    for name, jobs in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        out = str(tmp_path / name / "out")
        specs[name] = _spec(tmp_path / name, fmnist_root, recipes=recipe, out=out, jobs=jobs)
    serial, parallel = specs["a"], specs["b"]
    monkeypatch.setattr("fedlit.comparison.runner.available_cores", lambda: 2)  # 1 thread a job
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the parallel processes (a CPU's sums follow threads)
    try:
        main(["compare", f"--config={serial}"])
    finally:
        torch.set_num_threads(threads)
    main(["compare", f"--config={parallel}"])
    capsys.readouterr()
    for seed in (0, 1):
        rel = Path("default/server_sl") / f"seed{seed}" / "metrics.csv"
        one, two = _csv(tmp_path / "a/out" / rel), _csv(tmp_path / "b/out" / rel)
        assert [r["test/acc"] for r in one] == [r["test/acc"] for r in two]
    logs = sorted((tmp_path / "b/out/logs").glob("*.log"))
    assert len(logs) == 2 and all("round 2/2" in log.read_text() for log in logs)


def test_compare_in_parallel_stops_on_a_failed_run(tmp_path: Path) -> None:
    comparison = Comparison(
        name="c", recipes=[str(REPO / "recipes/server_sl.yaml")], seeds=[0, 1, 2], out=str(tmp_path)
    )
    runs = plan(comparison)
    started: list[str] = []

    def fit(args: list[str]) -> None:
        started.append(args[-1])
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="failed; the first: boom"):
        execute(runs, dict.fromkeys(runs, 1), fit, log=lambda _: None, jobs=2)
    assert len(started) < 3  # the third run never started
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        Comparison(name="c", recipes=comparison.recipes, jobs=0)


def test_compare_rerun_runs_nothing(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, fmnist_root, recipes=[str(REPO / "recipes/server_sl.yaml")], seeds=[0])
    main(["compare", f"--config={spec}"])
    before = (tmp_path / "out/default/server_sl/seed0/metrics.csv").read_text()
    capsys.readouterr()
    main(["compare", f"--config={spec}"])
    assert "finished, skipped" in capsys.readouterr().out
    assert (tmp_path / "out/default/server_sl/seed0/metrics.csv").read_text() == before


def test_a_comparison_sharing_another_ones_runs_leaves_its_report_alone(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A comparison of another name on the same out folder skips the runs it shares and writes
    its own report files; the first comparison's stay as they were."""
    server_sl = [str(REPO / "recipes/server_sl.yaml")]
    main(["compare", f"--config={_spec(tmp_path, fmnist_root, recipes=server_sl, seeds=[0])}"])
    out = tmp_path / "out"
    first = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"tiny.md", "tiny.csv", "tiny_curves.png"} <= set(first)
    capsys.readouterr()
    again = _spec(tmp_path, fmnist_root, recipes=server_sl, seeds=[0], name="tiny_again")
    main(["compare", f"--config={again}"])
    assert "finished, skipped" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in first} == first
    assert "# Comparison: tiny_again" in (out / "tiny_again.md").read_text()


def test_compare_bad_input_stops_before_any_run(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(
        tmp_path, fmnist_root, overrides=[*_tiny(fmnist_root), "--model.init_args.loss.tau=7"]
    )
    with pytest.raises(SystemExit) as exc:
        main(["compare", f"--config={spec}"])
    assert exc.value.code == 2
    assert not (tmp_path / "out" / "default" / "fedavg_fixmatch").exists()
    with pytest.raises(SystemExit):
        main(["compare", f"--config={_spec(tmp_path, fmnist_root, seeds=[1, 1])}"])
    with pytest.raises(SystemExit) as exc:
        main(["compare", f"--config={_spec(tmp_path, fmnist_root, baseline='fedsup')}"])
    assert "baseline: 'fedsup'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", f"--config={_spec(tmp_path, fmnist_root, name='a/b')}"])
    assert exc.value.code == 2 and "name='a/b'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_calibration_needs_a_baseline_and_a_number(tmp_path: Path) -> None:
    """``calibration`` (points) judges the oracle's difference from the baseline: without a
    baseline, or not a finite number, the spec is refused naming it."""
    recipes = [str(REPO / "recipes/server_sl.yaml"), str(REPO / "recipes/fedavg_sl.yaml")]
    spec = {"name": "c", "recipes": recipes, "out": str(tmp_path / "out")}
    with pytest.raises(ValueError, match=r"calibration=5: give a baseline"):
        Comparison(**spec, calibration=5)
    for bad in ("five", math.nan, True):
        with pytest.raises(ValueError, match=r"calibration must be a number of points"):
            Comparison(**spec, baseline="server_sl", calibration=bad)
    assert Comparison(**spec, baseline="server_sl", calibration=5).calibration == 5


def test_compare_logs_to_wandb_offline(
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # W&B's own console lines are checked
    monkeypatch.delenv("WANDB_QUIET", raising=False)
    spec = _spec(
        tmp_path,
        fmnist_root,
        recipes=[str(REPO / "recipes/server_sl.yaml"), str(REPO / "recipes/fedavg_fixmatch.yaml")],
        seeds=[0, 1],
        baseline="server_sl",
        wandb={"project": "fedlit-test", "offline": True},
    )
    main(["compare", f"--config={spec}"])
    console = capfd.readouterr()
    shown = console.out + console.err
    # W&B's own closing line comes from its service, and not always before the capture ends;
    # these lines did show before the comparison's runs were made quiet (each run's summary)
    assert "Run summary" not in shown and "Run history" not in shown  # no per-run block
    assert "anonymous" not in shown  # no warning of a setting nobody gave
    assert "environment variables will be ignored" not in shown
    out_lines = [line for line in console.out.splitlines() if line.strip()]
    assert out_lines[-1].startswith("{") and out_lines[-2].startswith("| ")  # the table last
    for method in ("server_sl", "fedavg_fixmatch"):
        for seed in (0, 1):  # each run of the comparison is a W&B run of its own, in one group
            run_dir = tmp_path / f"out/default/{method}/seed{seed}"
            (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
            records = wandb_records(run_file)
            run = next(r["run"] for r in records if r["type"] == "run")
            assert run["run_group"] == "tiny"
            assert run["job_type"] == method  # W&B's runs table groups each method's runs
            assert {method, "default", f"seed{seed}"} <= set(run["tags"])
            config: dict = {}
            for r in records:
                if r["type"] == "run":
                    config |= r["run"].get("config", {}).get("update", {})
                if r["type"] == "config":
                    config |= r["config"].get("update", {})
            assert config["seed_everything"] == seed  # the full resolved config
            assert config["setting"] == "default" and config["method"] == method
            assert config["data.examples_per_client"] == 32
            declared = {
                r["metric"]["name"]: r["metric"].get("summary")
                for r in records
                if r["type"] == "metric" and "name" in r["metric"]
            }
            assert declared["val/acc"] == {"max": True}
            assert declared["test/acc"] == {"last": True}
            summary: dict = {}
            for r in records:
                if r["type"] == "summary":
                    summary |= r["summary"].get("update", {})
            vals = [
                float(row["val/acc"]) for row in _csv(run_dir / "metrics.csv") if row.get("val/acc")
            ]
            assert summary["val/acc"] == {"max": pytest.approx(max(vals))}
            history = [r["history"]["item"] for r in records if r["type"] == "history"]
            assert any("partition/R" in h for h in history)  # the partition summary
            assert sum("test/acc" in h for h in history) == 2  # two rounds, this run's only
            files = [
                f["path"] for r in records if r["type"] == "files" for f in r["files"]["files"]
            ]
            assert any(p.startswith("media/images/partition") for p in files)  # partition plot
    (results,) = (tmp_path / "out").glob("wandb/offline-run-*/files/media/table/results_*.json")
    table = json.loads(results.read_text())
    rows = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["data"]}
    assert table["columns"][:2] == ["method", "setting"] and set(rows) == {
        "server_sl",
        "fedavg_fixmatch",
    }
    csv_rows = _csv(tmp_path / "out" / "tiny.csv")
    (csv_row,) = [r for r in csv_rows if r["method"] == "fedavg_fixmatch"]
    fixmatch = rows["fedavg_fixmatch"]  # the report's units: percent, points, the bounds
    assert fixmatch["final_mean"] == pytest.approx(float(csv_row["final_mean"]))
    assert fixmatch["final_mean"] > 1  # percent, not a fraction
    mean, half = float(csv_row["delta_mean"]), float(csv_row["delta_ci95"])
    assert "delta_ci95" not in fixmatch
    assert fixmatch["delta_ci95_low"] == pytest.approx(mean - half)
    assert fixmatch["delta_ci95_high"] == pytest.approx(mean + half)
    assert fixmatch["seeds"] == "0 1"


def test_report_and_partition_commands(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = REPO / "recipes/fedavg_fixmatch.yaml"
    dirichlet = ["--data.partitioner=fedlit.data.partition.Dirichlet"]
    dirichlet.append("--data.partitioner.init_args.alpha=0.1")
    plot = tmp_path / "partition.png"
    main(["partition", f"--config={recipe}", *_tiny(fmnist_root), *dirichlet, f"--out={plot}"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    counts = np.array(list(summary["class_counts"].values()))
    assert counts.shape == (2, 10) and counts.sum(axis=1).tolist() == [32, 32]
    assert 0 < summary["partition/R"] <= 1
    for seed in (0, 1):
        run = [f"--seed_everything={seed}", f"--trainer.default_root_dir={tmp_path / f'r{seed}'}"]
        main(["fit", f"--config={recipe}", *_tiny(fmnist_root), *run])
    capsys.readouterr()
    main(["report", str(tmp_path / "r0"), str(tmp_path / "r1"), f"--out={tmp_path / 'rep'}"])
    rows = _csv(tmp_path / "rep" / "results.csv")
    assert len(rows) == 1 and rows[0]["seeds"] == "0 1"
    bad = [str(tmp_path / "r0"), "--baseline=server_sl", f"--out={tmp_path / 'bad'}"]
    with pytest.raises(SystemExit) as exc:
        main(["report", *bad])  # r0 is fedavg_fixmatch: there is no server_sl run
    assert exc.value.code == 2 and "baseline" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("spec", ["paper002_fmnist.yaml", "paper002_fmnist_cnn.yaml"])
def test_paper002_specs_run_one_protocol(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paper 002's Table 1 specs: the five methods on one protocol (only the method's block
    differs between the recipes), IID and RandomProportions, the paper's numbers beside."""
    from fedlit.cli import resolve

    monkeypatch.chdir(REPO)
    values = yaml.safe_load((REPO / "recipes/comparisons" / spec).read_text())
    comparison = Comparison(**values)
    methods = ["server_sl", "fedavg_sl", "fedavg_fixmatch", "fedavg_uda", "fedseal"]
    assert [Path(r).stem for r in comparison.recipes] == methods
    assert comparison.baseline == "server_sl" and len(comparison.seeds) == 3
    assert set(comparison.published) == set(methods)
    assert comparison.published["fedseal"] == {"iid": 84.28, "noniid": 84.18}
    protocols = {}
    for run in plan(comparison):
        if run.seed != comparison.seeds[0]:
            continue
        config = resolve(run.args).config.as_dict()
        partitioner = config["data"]["partitioner"]["class_path"]
        expected = "IID" if run.setting == "iid" else "RandomProportions"
        assert partitioner == f"fedlit.data.partition.{expected}"
        init = config["model"]["init_args"]
        common = {
            "data": {k: v for k, v in config["data"].items() if k != "partitioner"},
            "federation": config["federation"] | {"resume": None},
            "optim": init["optim"],
            "network": init["network"],
        }
        protocols.setdefault(run.setting, []).append(json.dumps(common, sort_keys=True))
    for setting, seen in protocols.items():
        assert len(seen) == len(methods) and len(set(seen)) == 1, setting
    backbone = json.loads(protocols["iid"][0])["network"]["backbone"]
    assert backbone == ("resnet18" if spec == "paper002_fmnist.yaml" else "small_cnn")


@pytest.mark.parametrize(
    ("spec", "group", "key", "values"),
    [
        ("cpu_precision.yaml", "trainer", "precision", {"fp32": "32-true", "bf16": "bf16-mixed"}),
        ("cpu_compile.yaml", "federation", "compile", {"eager": None, "compiled": "default"}),
    ],
)
def test_a_setting_comparison_runs_each_method_and_seed_in_both_settings(
    monkeypatch: pytest.MonkeyPatch, spec: str, group: str, key: str, values: dict[str, object]
) -> None:
    """The comparisons of one setting (the precision behind the CPU default; the compiled
    step against eager): each method and seed run twice, the two runs' configs equal but for
    that setting (and their run folders)."""
    from fedlit.cli import resolve

    monkeypatch.chdir(REPO)
    comparison = Comparison(**yaml.safe_load((REPO / "recipes/comparisons" / spec).read_text()))
    assert list(comparison.settings) == list(values)
    configs: dict[tuple[str, int], dict[str, dict]] = {}
    for run in plan(comparison):
        config = resolve(run.args).config.as_dict()
        assert config["trainer"].pop("default_root_dir") == str(run.run_dir)
        configs.setdefault((run.recipe.stem, run.seed), {})[run.setting] = config
    assert len(configs) == len(comparison.recipes) * len(comparison.seeds)
    for pair in configs.values():
        assert {name: pair[name][group].pop(key) for name in values} == values
        first, second = (pair[name] for name in values)
        assert first == second


def test_a_comparison_flags_a_bootstrap_and_silent_clients(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FedSEAL (10 bootstrap epochs) against FedAvg-FixMatch whose clients contribute nothing
    (``recipe_overrides``: tau 1 for FedAvg-FixMatch alone, a setting FedSEAL does not take):
    the report, its CSV and the terminal flag FedSEAL's server budget beside its interval and
    FedAvg-FixMatch's silent clients; ``fedlit report`` prints the same table."""
    recipes = [str(REPO / "recipes/fedavg_fixmatch.yaml"), str(REPO / "recipes/fedseal.yaml")]
    spec = _spec(
        tmp_path,
        fmnist_root,
        recipes=recipes,
        seeds=[0],
        baseline="fedavg_fixmatch",
        recipe_overrides={"fedavg_fixmatch": ["--model.init_args.loss.tau=1.0"]},
    )
    main(["compare", f"--config={spec}"])
    shown = capsys.readouterr().out
    out = tmp_path / "out"
    hparams = {
        method: yaml.safe_load((out / f"default/{method}/seed0/hparams.yaml").read_text())
        for method in ("fedavg_fixmatch", "fedseal")
    }
    assert hparams["fedavg_fixmatch"]["model.init_args.loss.tau"] == 1.0  # its own override
    assert "model.init_args.loss.tau" not in hparams["fedseal"]  # FedSEAL has no tau
    # FedSEAL: 10 bootstrap epochs + 2 rounds x 1 server epoch; FedAvg-FixMatch: 2 rounds x
    # (its server step + its fine-tune) x 1 epoch; 50 labels in batches of 64: 1 step an epoch
    budget = "server budget: 12 epochs (bootstrap 10) vs 4 epochs"
    rows = {row["method"]: row for row in _csv(out / "tiny.csv")}
    assert rows["fedseal"]["flags"] == budget
    assert rows["fedavg_fixmatch"]["flags"] == "clients contributed nothing"
    assert (rows["fedseal"]["server_epochs"], rows["fedseal"]["bootstrap_epochs"]) == (
        "12.0",
        "10.0",
    )
    assert (rows["fedavg_fixmatch"]["silent_rounds"], rows["fedavg_fixmatch"]["client_rounds"]) == (
        "2",
        "2",
    )
    text = (out / "tiny.md").read_text()
    for where in (text, shown):
        lines = where.splitlines()
        header = _cells(next(line for line in lines if line.startswith("| method |")))
        fedseal = _cells(next(line for line in lines if line.startswith("| fedseal |")))
        flags = header.index("flags")  # beside the paired difference and its interval
        assert header[flags - 1] == "vs fedavg_fixmatch (paired, 95% CI)"
        assert fedseal[flags] == budget
        assert "- fedavg_fixmatch: " in where and "flagged: clients contributed nothing" in where
        assert "| fedseal | 12 (bootstrap 10 + 2 x 1) | 12 | - | 0/2 |" in where
        assert "| fedavg_fixmatch | 4 (4 x 1) | 4 | - | 2/2 | 0.0% |" in where
    assert "### Settings that differ: default" in text
    assert "| `model.init_args.bootstrap_epochs`" not in text  # in the budget's table instead
    assert "| `model.init_args.loss.tau` | `1.0` | - |" in text
    assert "- `fedavg_fixmatch` only: `--model.init_args.loss.tau=1.0`" in text
    main(["report", str(out / "default"), "--baseline=fedavg_fixmatch", f"--out={tmp_path / 'r'}"])
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].startswith("{")  # the files written, last, as JSON
    assert f"| {budget} |" in printed and "| fedavg_fixmatch | 4 (4 x 1) |" in printed


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_recipe_overrides_name_recipes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Overrides of one recipe go into its runs' arguments alone, after the comparison's and
    the setting's; a name that is no recipe's is refused naming it, before anything runs."""
    recipes = [str(REPO / "recipes/fedavg_fixmatch.yaml"), str(REPO / "recipes/fedseal.yaml")]
    own = ["--model.init_args.bootstrap_epochs=1"]
    comparison = Comparison(
        name="c",
        recipes=recipes,
        overrides=["--federation.rounds=3"],
        settings={"iid": ["--federation.server_epochs=2"]},
        recipe_overrides={"fedseal": own},
        out=str(tmp_path / "out"),
    )
    args = {run.method: run.args for run in plan(comparison)}
    assert args["fedseal"][1:4] == ("--federation.rounds=3", "--federation.server_epochs=2", *own)
    assert not any("bootstrap" in arg for arg in args["fedavg_fixmatch"])
    spec = tmp_path / "bad.yaml"
    bad = {"name": "c", "recipes": recipes, "recipe_overrides": {"fedsael": own}}
    spec.write_text(yaml.safe_dump({**bad, "out": str(tmp_path / "out")}))
    err = refused(["compare", f"--config={spec}"], capsys)
    assert (
        "recipe_overrides: 'fedsael' is not one of the recipes ['fedavg_fixmatch', 'fedseal']"
        in err
    )
    assert not (tmp_path / "out").exists()


def test_a_description_is_marked_the_specs_where_the_command_changed_the_seeds(
    tmp_path: Path,
) -> None:
    """A spec whose description says "seeds 0-2", run with ``--seeds [0]``: the report says
    the description is the spec's and that the command gave its own seeds."""
    from fedlit.comparison.report import about_lines

    recipe = Path(__file__).parents[1] / "recipes" / "server_sl.yaml"
    comparison = Comparison(
        name="c", recipes=[str(recipe)], seeds=[0], out=str(tmp_path), description=["Seeds 0-2."]
    )
    counts = {"run": 0, "resumed": 0, "skipped": 0}
    command = "fedlit compare --config c.yaml --seeds [0]"
    lines = about_lines(comparison, [], [], counts, 0.0, command)
    assert lines[:3] == [
        "Seeds 0-2.",
        "",
        "*The description above is the spec's; this command gave its own `seeds` (below).*",
    ]
    assert "- seeds: [0]" in lines
    plain = about_lines(comparison, [], [], counts, 0.0, "fedlit compare --config c.yaml")
    assert not any("description above" in line for line in plain)
