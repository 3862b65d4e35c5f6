"""A tuned comparison (``tune``): studies through the real CLI, resumed after a stop, scored
on seeds the tuning never saw; its refusals; the methods' search spaces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml
from conftest import recording_wandb_init, refused, tiny_overrides, wandb_records

from fedlit.cli import main
from fedlit.comparison.selection import (
    accuracy_se,
    flip_rate,
    paired_se,
    recorded_scores,
    score_se,
    val_correct,
    within_one_se,
)
from fedlit.comparison.tune import method_class
from fedlit.search_space import SERVER_EPOCHS, SERVER_LR, Distribution, space_table

REPO = Path(__file__).parents[1]
RECIPES = [str(REPO / "recipes/server_sl.yaml"), str(REPO / "recipes/fedavg_fixmatch.yaml")]


def _spec(tmp_path: Path, root: Path, out: str = "out", **tune: Any) -> Path:
    spec = {
        "name": "tuned",
        "out": str(tmp_path / out),
        "recipes": tune.pop("recipes", RECIPES),
        "seeds": [0],
        # no final evaluations: server_sl's recipe asks for them, and a trial never reads them
        "overrides": [*tiny_overrides(root, rounds=2), "--federation.final_eval=[]"],
        "baseline": "server_sl",
        "every_label": tune.pop("every_label", False),
        "tune": {"trials": 3, "seeds": [100], "sampler_seed": 7, **tune},
    }
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _trials(out: Path, name: str = "tuned") -> dict[str, list[tuple[str, dict[str, Any], Any]]]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "tune" / "studies.journal"))
    )
    studies = {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        studies[summary.study_name.removeprefix(f"{name}/")] = [
            (t.state.name, t.params, t.value) for t in study.get_trials()
        ]
    return studies


def test_a_tuned_comparison_scores_the_best_settings_on_unseen_seeds(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, fmnist_root, every_label=True, runner_up=True)
    main(["compare", f"--config={spec}"])
    err = capsys.readouterr().err  # said once by the comparison, not by each of its runs
    assert err.count("importing torch and Lightning") == 1 and "baseline to beat" not in err
    out = tmp_path / "out"
    studies = _trials(out)
    assert sorted(studies) == ["default/fedavg_fixmatch", "default/server_sl"]
    for name, trials in studies.items():
        assert len(trials) >= 3 and all(s in ("COMPLETE", "PRUNED") for s, _, _ in trials)
        method = name.split("/")[1]
        # the budget: 3 unpruned trials' rounds (2 each), spent to within one trial's
        spent = [
            len(_csv(out / "tune/default" / method / f"trial{n}/seed100/metrics.csv")) - 1
            for n in range(len(trials))
        ]
        assert 6 - 2 < sum(spent) <= 6
        # every trial ran on the tuning seed only, in its own directory
        for number in range(3):
            assert (out / "tune" / "default" / method / f"trial{number}" / "seed100").is_dir()
        assert not (out / "tune" / "default" / method / "trial0" / "seed0").exists()
        best = max((t for t in trials if t[0] == "COMPLETE"), key=lambda t: t[2])
        # the scored run (seed 0) took the best trial's settings
        config = yaml.safe_load((out / "default" / method / "seed0" / "config.yaml").read_text())
        lr = config["model"]["init_args"]["optim"]["server_lr"]
        assert lr == pytest.approx(best[1][SERVER_LR])
        assert config["federation"]["server_epochs"] == best[1][SERVER_EPOCHS]
        info = json.loads((out / "tune/default" / method / "trial0/seed100/run.json").read_text())
        trial = (out / "tune/default" / method / "trial0/seed100/config.yaml").read_text()
        trial = yaml.safe_load(trial)
        assert trial["federation"]["final_eval"] == []  # scored by its rounds' val/acc alone
        # a trial never evaluates the test set, and records its validation images by round
        assert trial["federation"]["val_only"] is True
        trial_rows = _csv(out / "tune/default" / method / "trial0/seed100/metrics.csv")
        assert not any(key.startswith("test/") and row[key] for row in trial_rows for key in row)
        scores = recorded_scores(out / "tune/default" / method / "trial0/seed100", 3)
        assert scores is not None and scores.shape == (20,)
        assert info["trial"] == "0" and info["study"] == f"tuned/default/{method}"
        # a trial's score is its val/acc, never its test/acc
        run = out / "tune" / "default" / method / f"trial{trials.index(best)}" / "seed100"
        rows = [r for r in _csv(run / "metrics.csv") if r.get("val/acc")]
        assert best[2] == pytest.approx(float(rows[-1]["val/acc"]))
        # the selection noise's image-by-image scoring is the run's own last val/acc
        right = val_correct([f"--config={run / 'config.yaml'}"], run, 100)
        assert right.shape == (20,) and right.mean() == pytest.approx(best[2])
    fixmatch = studies["default/fedavg_fixmatch"]
    assert all("model.init_args.loss.tau" in params for _, params, _ in fixmatch)
    report = (out / "tuned.md").read_text()
    assert "### Tuning" in report and "| default | fedavg_fixmatch |" in report
    assert "tuning seeds [100]" in report and "scored on [0]" in report
    assert "| 20, " in report  # 20 validation images, the SE of an accuracy on them beside
    assert "| ties | within 1 SE |" in report and " of " in report.split("### Tuning")[1]
    scored = yaml.safe_load((out / "default/server_sl/seed0/config.yaml").read_text())
    assert not scored["federation"]["val_only"]  # the scored runs evaluate the test set
    # Server-SL on every label: the baseline's chosen settings, its 5 + 2 labels per class
    every = yaml.safe_load((out / "default/server_sl_every_label/seed0/config.yaml").read_text())
    assert (every["data"]["labeled_per_class"], every["data"]["val_per_class"]) == (7, 0)
    assert every["model"]["init_args"]["optim"] == scored["model"]["init_args"]["optim"]
    assert "| server_sl_every_label |" in report
    assert "one budget of 7 per class: 5 to train on, 2 carved from it" in report
    # the runner-up's settings on the scoring seed, set against the chosen settings' on test
    for method, trials in studies.items():
        done = sorted((-t[2], n) for n, t in enumerate(trials) if t[0] == "COMPLETE")
        second = trials[done[1][1]][1]
        folder = out / "default" / f"{method.split('/')[1]}_runner_up" / "seed0"
        config = yaml.safe_load((folder / "config.yaml").read_text())
        lr = config["model"]["init_args"]["optim"]["server_lr"]
        assert lr == pytest.approx(second[SERVER_LR])
        assert json.loads((folder / "run.json").read_text())["method"].endswith("_runner_up")
    assert "The selection noise on the test set" in report
    assert "- default / server_sl: " in report and "over 1 seed" in report
    assert "_runner_up |" not in report  # not a row of the results
    # run again: nothing runs, no study grows
    journal = (out / "tune" / "studies.journal").read_bytes()
    capsys.readouterr()
    main(["compare", f"--config={spec}"])
    log = capsys.readouterr().out
    assert "tuning default" not in log and "finished, skipped" in log
    assert (out / "tune" / "studies.journal").read_bytes() == journal
    # the same out with another sampler seed: refused, the studies left as they are
    values = yaml.safe_load(spec.read_text())
    values["tune"]["sampler_seed"] = 8
    spec.write_text(yaml.safe_dump(values))
    err = refused(["compare", f"--config={spec}"], capsys)
    assert "tuned/default/server_sl" in err and "another sampler" in err
    assert (out / "tune" / "studies.journal").read_bytes() == journal


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_stopped_study_resumes_to_the_same_trials(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped inside trial 1's second round (SIGINT's KeyboardInterrupt: trial 0 told, trial
    1 left running in the study with its run's checkpoint after round 1, as a kill leaves it),
    then run again: the same settings tried, each trial told once, the same best, as without
    the stop."""
    from fedlit.federation import Federation

    recipes = RECIPES[:1]
    whole = _spec(tmp_path, fmnist_root, "whole", recipes=recipes, pruner="none")
    main(["compare", f"--config={whole}"])
    stopped = _spec(tmp_path, fmnist_root, "stopped", recipes=recipes, pruner="none")
    original, calls = Federation.run_round, []

    def stopping(self: Federation, index: int) -> dict[str, float]:
        calls.append(index)
        if len(calls) == 4:  # trial 0's rounds 1 and 2, trial 1's round 1, then this
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(Federation, "run_round", stopping)
    with pytest.raises(SystemExit):
        main(["compare", f"--config={stopped}"])
    monkeypatch.setattr(Federation, "run_round", original)
    mid = _trials(tmp_path / "stopped")["default/server_sl"]
    assert [s for s, _, _ in mid] == ["COMPLETE", "RUNNING"]
    trial1 = tmp_path / "stopped/tune/default/server_sl/trial1/seed100"
    assert len(_csv(trial1 / "metrics.csv")) == 2  # round 0 and round 1: it resumes
    main(["compare", f"--config={stopped}"])
    assert _trials(tmp_path / "stopped") == _trials(tmp_path / "whole")
    assert len(_csv(trial1 / "metrics.csv")) == 3  # round 2 was added, round 1 not run again


def test_pruned_trials_stop_early_and_count_their_rounds(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """With the median rule from the first trial on, a trial below the first one's round-1
    score stops after round 1: its run has one round, it is PRUNED, the report counts it, and
    the round it did not run goes to a further trial (the budget is 4 trials' 8 rounds)."""
    # server learning rates that learn within the tests' two rounds: the trials' scores differ
    lr = {"model.init_args.optim.server_lr": {"low": 0.05, "high": 0.5, "log": True}}
    spec = _spec(
        tmp_path,
        fmnist_root,
        recipes=RECIPES[:1],
        trials=4,
        startup_trials=1,
        warmup_rounds=0,
        sampler_seed=0,
        spaces={"server_sl": lr},
    )
    main(["compare", f"--config={spec}"])
    out = tmp_path / "out"
    trials = _trials(out)["default/server_sl"]
    rounds = [
        len(_csv(out / "tune" / "default" / "server_sl" / f"trial{n}" / "seed100" / "metrics.csv"))
        for n in range(len(trials))
    ]
    for (state, _, _), n in zip(trials, rounds, strict=True):
        # metrics.csv: round 0's row, then one per round run
        assert n == (2 if state == "PRUNED" else 3)
    pruned = sum(s == "PRUNED" for s, _, _ in trials)
    total = sum(r - 1 for r in rounds)
    assert pruned > 0 and len(trials) >= 4 and 8 - 2 < total <= 8
    assert f"| default | server_sl | {len(trials) - pruned} / {pruned} | {total} |" in (
        out / "tuned.md"
    ).read_text()


@pytest.mark.parametrize(
    ("spent", "jobs", "size"),
    [(0, 2, 2), (100, 2, 2), (101, 2, 1), (110, 2, 1), (111, 2, 0), (106, 1, 1), (120, 2, 0)],
)
def test_a_batch_draws_the_trials_that_fit_in_the_budget(spent: int, jobs: int, size: int) -> None:
    """A budget of 120 rounds, 10 a trial: a batch draws up to ``jobs`` trials whose rounds,
    all run, still fit; none once fewer than 10 rounds are left."""
    from fedlit.comparison.studies import batch_size

    assert batch_size(120, spent, 10, jobs) == size


@pytest.mark.parametrize(
    ("tune", "named"),
    [
        ({"objective": "test/acc"}, "tune.objective='test/acc'"),
        ({"trials": 0}, "tune.trials"),
        ({"spaces": {"server_sl": {}}}, "tune.spaces.server_sl: an empty space"),
        ({"spaces": {"server_sl": {"model.init_args.loss.tau": {"low": 0.5, "high": 0.9}}}},
         "tune.spaces.server_sl.model.init_args.loss.tau: not a setting ServerSL tunes"),
        ({"spaces": {"server_sl": {"": {"low": 0.5, "high": 0.9}}}}, "an empty key"),
        ({"seeds": [0, 100]}, "tune.seeds: [0] are also the comparison's seeds"),
        ({"spaces": {"server_sl": {SERVER_LR: {"low": 0.1, "high": 0.01}}}},
         f"tune.spaces.server_sl.{SERVER_LR}: low=0.1 is above high=0.01"),
        ({"spaces": {"nope": {SERVER_LR: {"low": 0.01, "high": 0.1}}}}, "'nope'"),
        # issue 73: every field checked before anything is written
        ({"objective": "val/bogus"}, "tune.objective='val/bogus': not a validation metric"),
        ({"objective": "val/loss"}, "tune.objective='val/loss'"),
        ({"sampler_seed": -1}, "tune.sampler_seed=-1"),
        ({"seeds": [-1]}, "tune.seeds: -1 is not a seed"),
        ({"trials": 10**9}, "tune.trials=1000000000: at most 10000"),
        ({"spaces": {"server_sl": {SERVER_LR: {"low": "a", "high": 0.1}}}},
         f"tune.spaces.server_sl.{SERVER_LR}: low='a' is not a number"),
        ({"recipes": [*RECIPES, "UNTUNED"]}, "Untuned (untuned) declares no search space"),
    ],
)
def test_refused_by_name_before_anything_is_written(
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tune: dict[str, Any],
    named: str,
) -> None:
    if "UNTUNED" in tune.get("recipes", []):  # a recipe whose method has no search space
        untuned = tmp_path / "untuned.yaml"
        text = (REPO / "recipes/server_sl.yaml").read_text()
        untuned.write_text(text.replace("fedlit.methods.ServerSL", "own_optimizers.Untuned"))
        tune["recipes"] = [str(untuned) if r == "UNTUNED" else r for r in tune["recipes"]]
    spec = _spec(tmp_path, fmnist_root, **tune)
    err = refused(["compare", f"--config={spec}"], capsys)
    assert named in err, err
    assert "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_replaced_space_with_a_key_no_recipe_has_is_refused_by_the_parser(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(
        tmp_path,
        fmnist_root,
        spaces={"server_sl": {"model.init_args.optim.no_such": {"low": 0.1, "high": 0.2}}},
        replace=["server_sl"],
    )
    err = refused(["compare", f"--config={spec}"], capsys)
    assert "no_such" in err
    assert not (tmp_path / "out").exists()


def test_every_recipe_method_declares_a_space_its_recipe_takes() -> None:
    """Each top-level recipe's method tunes the server's rate and epochs; every key of its
    space is a setting of its recipe, at both ends of its range."""
    from fedlit.resolver import resolve

    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        space = method_class(str(recipe)).search_space
        assert {SERVER_LR, SERVER_EPOCHS} <= set(space), recipe.name
        for end in ("low", "high"):
            args = [f"--config={recipe}", "--data.root=/nonexistent"]
            for key, dist in space.items():
                value = getattr(dist, end)
                args.append(f"--{key}={int(value) if dist.integer else value}")
            config = resolve(args).config
            for key, dist in space.items():
                node: Any = config
                for part in key.split("."):
                    node = node[part]
                assert node == pytest.approx(getattr(dist, end)), (recipe.name, key)


def test_the_method_pages_list_each_space() -> None:
    """Each method page shows, after each method's settings table (and FedAvg-SL's beside
    Server-SL's), that method's search space as the code declares it."""
    import re

    import fedlit.methods as methods

    shown = []
    for page in (REPO / "docs" / "methods").glob("*.md"):
        text = page.read_text()
        for name in re.findall(r"<!-- fedlit-settings fedlit\.methods\.(\w+) -->", text):
            shown.append(name)
            block = f"{name}'s search space, what a tuned comparison varies"
            table = space_table(getattr(methods, name).search_space)
            assert f"{block} ([`tune`](../tuning.md)):\n\n{table}\n" in text, name
        if page.name == "baselines.md":
            assert space_table(methods.FedAvgSL.search_space) in text
    assert len(shown) >= 14


def test_distribution_refusals_and_optuna_ranges() -> None:
    with pytest.raises(ValueError, match="low=2 is above high=1"):
        Distribution(2, 1)
    with pytest.raises(ValueError, match="log range needs low > 0"):
        Distribution(0, 1, log=True)
    with pytest.raises(ValueError, match="unknown field 'hi'"):
        Distribution.parse({"low": 0, "hi": 1})
    assert Distribution.parse({"low": 1, "high": 3, "integer": True}).to_optuna() == (
        optuna.distributions.IntDistribution(1, 3)
    )
    assert Distribution.parse({"choices": ["a", "b"]}).describe() == "one of `a`, `b`"


def test_flip_rate_counts_resamples_where_the_runner_up_wins() -> None:
    rng = np.random.default_rng(0)
    same = rng.random(50) < 0.7
    assert flip_rate([same], [same], draws=200) == 0.5  # a tie is a coin toss
    better, worse = np.ones(40, bool), np.zeros(40, bool)
    assert flip_rate([better], [worse], draws=200) == 0.0
    # one image apart out of 40: a tie whenever that image is not drawn, else the chosen wins
    a, b = np.ones(40, bool), np.ones(40, bool)
    b[0] = False
    expected = 0.5 * (39 / 40) ** 40
    assert flip_rate([a], [b], draws=4000) == pytest.approx(expected, abs=0.03)
    assert accuracy_se(0.8, 100) == pytest.approx(0.04)


def _wandb_run(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """An offline W&B run's run record and config, read by wandb's own inspector."""
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    run = next(r["run"] for r in records if r["type"] == "run")
    config: dict[str, Any] = {}
    for r in records:
        if r["type"] == "run":
            config |= r["run"].get("config", {}).get("update", {})
        if r["type"] == "config":
            config |= r["config"].get("update", {})
    return run, config


def test_trials_and_final_runs_are_told_apart_on_wandb_offline(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = _spec(tmp_path, fmnist_root, recipes=RECIPES[:1], trials=2)
    values = yaml.safe_load(spec.read_text())
    values["wandb"] = {"project": "fedlit-test", "offline": True}
    spec.write_text(yaml.safe_dump(values))
    main(["compare", f"--config={spec}"])
    out = tmp_path / "out"
    for number in range(2):
        run, config = _wandb_run(out / f"tune/default/server_sl/trial{number}/seed100")
        assert run["run_group"] == "tuned"
        assert {"trial", "server_sl", "default"} <= set(run["tags"])
        assert config["trial"] == number and config["seed"] == 100
        assert config["setting"] == "default" and config["method"] == "server_sl"
        assert f"tuned/{SERVER_LR}" in config and config["seed_everything"] == 100
    run, config = _wandb_run(out / "default/server_sl/seed0")
    assert run["run_group"] == "tuned" and "final" in run["tags"] and "trial" not in run["tags"]
    (table,) = out.glob("wandb/offline-run-*/files/media/table/tuning_*.json")
    summary = json.loads(table.read_text())
    assert summary["columns"][:4] == ["setting", "method", "complete", "pruned"]
    assert [row[:2] for row in summary["data"]] == [["default", "server_sl"]]


def test_the_tuned_warm_spec_is_the_calibrated_protocol_tuned() -> None:
    """fmnist_warm_tuned: fmnist_warm_long_lr02's protocol (overrides, settings, warm start,
    score), its four main recipes, each tuned with >= 12 trials on a seed it is not scored on."""
    from fedlit.comparison import Comparison
    from fedlit.comparison.tune import TuneSettings

    folder = REPO / "recipes/comparisons"
    tuned = yaml.safe_load((folder / "fmnist_warm_tuned.yaml").read_text())
    untuned = yaml.safe_load((folder / "fmnist_warm_long_lr02.yaml").read_text())
    for key in ("overrides", "settings", "init_from", "last_k", "baseline"):
        assert tuned[key] == untuned[key], key
    assert set(tuned["recipes"]) <= set(untuned["recipes"])
    stems = [Path(r).stem for r in tuned["recipes"]]
    assert {"server_sl", "fedavg_sl", "fedavg_fixmatch", "fedseal"} <= set(stems)
    tune = TuneSettings(**tuned.pop("tune"))
    assert tune.trials >= 12 and tune.pruner != "none" and tune.objective == "val/acc"
    assert len(tuned["seeds"]) == 3 and not set(tune.seeds) & set(tuned["seeds"])
    tuned["recipes"] = [str(REPO / r) for r in tuned["recipes"]]
    tuned["init_from"]["recipe"] = str(REPO / tuned["init_from"]["recipe"])
    from fedlit.comparison.spec import SourceRun

    tuned["init_from"] = SourceRun(**tuned["init_from"])
    Comparison(**tuned, tune=tune)  # checked as fedlit compare checks it


def test_a_tune_section_that_is_no_mapping_is_refused(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, fmnist_root)
    values = yaml.safe_load(spec.read_text())
    values["tune"] = 12
    spec.write_text(yaml.safe_dump(values))
    err = refused(["compare", f"--config={spec}"], capsys)
    assert "tune=12: a group of settings is a mapping" in err
    assert not (tmp_path / "out").exists()


def test_a_budget_further_than_10_percent_from_the_baselines_is_flagged() -> None:
    from fedlit.comparison import Comparison
    from fedlit.comparison.studies import StudyResult
    from fedlit.comparison.tune import TuneSettings
    from fedlit.comparison.tune_report import tuning_lines

    comparison = Comparison(
        name="c", recipes=RECIPES, baseline="server_sl", tune=TuneSettings(trials=3)
    )
    results = [
        StudyResult("default", "server_sl", complete=3, rounds=100),
        StudyResult("default", "fedavg_fixmatch", complete=3, rounds=111),
        StudyResult("other", "server_sl", complete=3, rounds=100),
        StudyResult("other", "fedavg_fixmatch", complete=3, rounds=109),
    ]
    rows = [line for line in tuning_lines(comparison, results, {}) if line.startswith("| ")]
    flagged = {tuple(row.split(" | ")[:2]): "!" in row.split(" | ")[3] for row in rows[1:]}
    assert flagged == {
        ("| default", "server_sl"): False,
        ("| default", "fedavg_fixmatch"): True,
        ("| other", "server_sl"): False,
        ("| other", "fedavg_fixmatch"): False,
    }


def test_trials_in_child_processes_match_trials_in_this_one(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """``jobs: 2`` runs a batch's two trials at once, each in its own ``fedlit fit`` process,
    reporting to the journal from there: with every draw random (``startup_trials``), the
    trials are those of one process (one thread each, as ``jobs: 2`` gives on 2 cores)."""
    kw: dict[str, Any] = {"recipes": RECIPES[:1], "trials": 2, "startup_trials": 2}
    one = _spec(tmp_path, fmnist_root, "one", pruner="none", **kw)
    main(["compare", f"--config={one}"])
    two = _spec(tmp_path, fmnist_root, "two", pruner="none", **kw)
    values = yaml.safe_load(two.read_text())
    values["jobs"] = 2
    two.write_text(yaml.safe_dump(values))
    main(["compare", f"--config={two}"])
    assert _trials(tmp_path / "two") == _trials(tmp_path / "one")
    logs = list((tmp_path / "two" / "logs").glob("*_two_tune_default_server_sl_trial*.log"))
    assert len(logs) == 2  # each trial ran in a child process


def test_a_trial_whose_round_fails_is_a_failed_trial_of_the_budget(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial whose run has a failed round (a diverged setting: the global model no longer
    finite) is told FAIL and counted in the budget; the study goes on, and run again the
    comparison runs nothing."""
    from fedlit.federation import Federation
    from fedlit.federation.faults import RoundFailed

    original = Federation.run_round

    def diverging(self: Federation, index: int) -> dict[str, float]:
        if "trial1" in str(self.run_dir) and index == 2:
            raise RoundFailed("the global model is no longer finite")
        return original(self, index)

    monkeypatch.setattr(Federation, "run_round", diverging)
    spec = _spec(tmp_path, fmnist_root, recipes=RECIPES[:1], pruner="none")
    main(["compare", f"--config={spec}"])
    out = tmp_path / "out"
    trials = _trials(out)["default/server_sl"]
    assert [s for s, _, _ in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert (out / "tune/default/server_sl/trial1/seed100/failed.json").is_file()
    assert "| default | server_sl | 2 / 0 / 1 failed | 5 |" in (out / "tuned.md").read_text()
    journal = (out / "tune" / "studies.journal").read_bytes()
    main(["compare", f"--config={spec}"])
    assert (out / "tune" / "studies.journal").read_bytes() == journal


def test_the_selection_noise_is_measured_on_the_score_the_choice_is_made_on(
    tmp_path: Path,
) -> None:
    """A trial's images' scores are their correctness over the last k recorded rounds (a
    resumed round's later line wins): their mean is the mean of those rounds' val/acc, the
    study's score. Two trials that disagree on few images differ with a paired SE far below
    either score's, and the trials within one paired SE of the chosen are counted."""
    run = tmp_path / "trial0"
    run.mkdir()
    rounds = {1: "0000", 2: "1100", 3: "1110", 4: "1111"}
    lines = [json.dumps({"round": r, "correct": bits}) for r, bits in rounds.items()]
    lines.insert(2, json.dumps({"round": 3, "correct": "0000"}))  # round 3 before a resume
    (run / "val_correct.jsonl").write_text("\n".join(lines) + "\n")
    scores = recorded_scores(run, 3)
    assert scores is not None
    assert scores.tolist() == pytest.approx([1, 1, 2 / 3, 1 / 3])
    assert scores.mean() == pytest.approx(np.mean([0.5, 0.75, 1.0]))  # last 3 rounds' val/acc
    assert recorded_scores(tmp_path / "absent", 3) is None
    # a trial of an earlier fedlit resumed now: its last 3 rounds are not all recorded
    from test_reporting import write_run

    history = [{"round": float(r), "val/acc": 0.5} for r in range(1, 5)]
    resumed = write_run(tmp_path / "resumed", history, rounds=4)
    (resumed / "val_correct.jsonl").write_text("\n".join(lines[-2:]) + "\n")  # rounds 3, 4
    assert recorded_scores(resumed, 3) is None
    assert recorded_scores(resumed, 2) == pytest.approx([1, 1, 1, 0.5])
    rng = np.random.default_rng(0)
    best = (rng.random(200) < 0.72).astype(float)
    near = best.copy()
    near[np.flatnonzero(best)[:2]] = 0.0  # two images fewer right: -1 point
    far = np.zeros(200)
    assert score_se([best]) == pytest.approx(np.std(best, ddof=1) / np.sqrt(200))
    assert score_se([best]) > 0.03 and paired_se([best], [near]) < 0.01
    # -1 point is more than one paired SE (0.70): the choice is told from it; a tie is not
    assert within_one_se([best], [[near], [far], [best.copy()]]) == 1


def test_ties_are_broken_by_trial_number_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study's best score shared by several trials: the first drawn is chosen, and the
    tuning section says how many tie."""
    from fedlit.comparison import Comparison, studies
    from fedlit.comparison.studies import _result
    from fedlit.comparison.tune import TuneSettings
    from fedlit.comparison.tune_report import Noise, tuning_lines

    comparison = Comparison(
        name="c", recipes=RECIPES, baseline="server_sl", out=str(tmp_path),
        tune=TuneSettings(trials=3),
    )  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for value in (0.70, 0.72, 0.72, 0.72, 0.69):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        study.tell(trial, value)
    # the runs' scores (read from their metrics in a real study) as the journal's
    monkeypatch.setattr(
        studies, "run_values", lambda c, s, m, trials: {t.number: t.value for t in trials}
    )
    result = _result(comparison, study, [], "default", "server_sl")
    assert (result.best_trial, result.runner_up_trial, result.ties) == (1, 2, 3)
    assert result.completed == (1, 2, 3, 0, 4)
    noise = {("default", "server_sl"): Noise(200, 0.72, 0.03, 0.5, "val/acc", 3, 4)}
    text = "\n".join(tuning_lines(comparison, [result], noise))
    assert "on a tie of scores, the first drawn (the lowest trial number)" in text
    assert "| 72.00 | 200, 3.00 | 50% | 3 | 3 of 4 |" in text
    assert "never evaluates the test set" in text
    old = {("default", "server_sl"): Noise(200, 0.72, 0.03, 0.5)}  # trials of an earlier fedlit
    assert "| 200, 3.00 (last round) | 50% | 3 | - |" in "\n".join(
        tuning_lines(comparison, [result], old)
    )


def test_the_every_label_row_trains_the_baseline_on_the_whole_label_budget(
    tmp_path: Path,
) -> None:
    """``every_label``: one run per scoring seed of the baseline's recipe at its chosen
    settings, its labels per class the training and validation labels together and no
    validation set, named by its row; refused by name without a baseline or its numbers."""
    from fedlit.comparison import Comparison, plan
    from fedlit.comparison.every_label import label_budget, with_every_label
    from fedlit.comparison.tune import TuneSettings
    from fedlit.data.draw import split_by_class

    tune = TuneSettings(trials=3)
    comparison = Comparison(
        name="c", recipes=RECIPES, baseline="server_sl", seeds=[0, 1], out=str(tmp_path),
        tune=tune, every_label=True,
    )  # fmt: skip
    runs = plan(comparison)
    per_run = dict.fromkeys(runs, 10)
    flat = {"data.labeled_per_class": 10, "data.val_per_class": 20}
    made, lines = with_every_label(comparison, runs, per_run, lambda args: flat)
    extra = made[len(runs) :]
    assert [(r.method, r.seed) for r in extra] == [("server_sl_every_label", s) for s in (0, 1)]
    assert extra[0].run_dir == tmp_path / "default" / "server_sl_every_label" / "seed0"
    args = list(extra[0].args)
    assert args[-4:] == [
        "--data.labeled_per_class=30",
        "--data.val_per_class=0",
        "--seed_everything=0",
        f"--trainer.default_root_dir={extra[0].run_dir}",
    ]  # after every override of the baseline's run, its chosen settings included
    assert '"method": "server_sl_every_label"' in extra[0].labels_arg()
    assert per_run[extra[0]] == 10
    assert "one budget of 30 per class: 10 to train on, 20 carved from it" in lines[0]
    assert "larger than the training labels" in lines[0]
    # the row's labeled set is the baseline's labeled and validation sets, its pool the same
    labels = np.repeat(np.arange(3), 40)

    def split(labeled: int, val: int) -> tuple[np.ndarray, ...]:
        return split_by_class(
            labels, np.random.default_rng(5), "d", 3, labeled_per_class=labeled,
            labeled_fraction=None, val_per_class=val, server_unlabeled_fraction=0.0,
        )  # fmt: skip

    base, every = split(4, 2), split(6, 0)
    assert every[0].tolist() == sorted([*base[0], *base[1]])
    assert every[3].tolist() == base[3].tolist()
    with pytest.raises(ValueError, match="every_label: .*data.val_per_class=0"):
        label_budget({"data.labeled_per_class": 10, "data.val_per_class": 0}, "default/server_sl")
    with pytest.raises(ValueError, match="data.labeled_per_class=None"):
        label_budget({"data.labeled_per_class": None, "data.val_per_class": 2}, "x")
    with pytest.raises(ValueError, match="every_label: give a baseline"):
        Comparison(name="c", recipes=RECIPES, out=str(tmp_path), tune=tune, every_label=True)
    with pytest.raises(ValueError, match="every_label must be true or false"):
        yes: Any = "yes"
        Comparison(name="c", recipes=RECIPES, out=str(tmp_path), every_label=yes)
    # an untuned comparison's row: the baseline as given, the budget line with it
    untuned = Comparison(
        name="c", recipes=RECIPES, baseline="server_sl", out=str(tmp_path), every_label=True
    )
    made, lines = with_every_label(untuned, plan(untuned), dict.fromkeys(plan(untuned), 10),
                                   lambda args: flat)  # fmt: skip
    assert [r.method for r in made][-1] == "server_sl_every_label"
    assert "one budget of 30 per class" in lines[0] and "chosen settings" not in lines[1]


def test_a_val_only_run_without_a_validation_set_is_refused(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``federation.val_only`` evaluates the validation set alone: without one (no
    ``data.val_per_class``) it would evaluate nothing, and is refused by name."""
    err = refused(
        [
            "fit", f"--config={RECIPES[0]}", *tiny_overrides(fmnist_root),
            "--data.val_per_class=0", "--federation.val_only=true",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ],
        capsys,
    )  # fmt: skip
    assert "federation.val_only" in err and "data.val_per_class=0" in err
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_a_study_whose_trials_all_fail_is_reported_as_not_tuned(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every trial's run fails (a range that diverges): the scored runs take the recipe's own
    settings, and the report says so, naming the study (it once read as tuned)."""
    from fedlit.federation import Federation
    from fedlit.federation.faults import RoundFailed

    original = Federation.run_round

    def diverging(self: Federation, index: int) -> dict[str, float]:
        if "tune" in Path(self.run_dir).parts and index == 2:
            raise RoundFailed("the global model is no longer finite")
        return original(self, index)

    monkeypatch.setattr(Federation, "run_round", diverging)
    spec = _spec(tmp_path, fmnist_root, recipes=RECIPES[:1], pruner="none", trials=1)
    main(["compare", f"--config={spec}"])
    report = (tmp_path / "out" / "tuned.md").read_text()
    assert "**default/server_sl is not tuned**: none of its trials completed" in report


def test_the_report_reads_the_runs_and_survives_a_torn_journal_and_gone_checkpoints(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished tuned comparison run again after (1) its journal's last record is cut mid
    line (a kill during a write: once Optuna's JSONDecodeError on every run): the cut record
    set aside, the study goes on to the same choice; a line cut before the last: refused by
    name, nothing changed; (2) a trial's value edited in the journal: the report gives its
    runs' score; (3) every trial's checkpoint deleted: the report is written, the selection
    noise said not measured (once a ValueError)."""
    spec = _spec(tmp_path, fmnist_root, recipes=RECIPES[:1], pruner="none", trials=2)
    main(["compare", f"--config={spec}"])
    log = capsys.readouterr().out  # the budget before the trials, each run's time after it
    assert "tuning: 1 study, up to 4 rounds of trials in all (2 trials" in log
    assert re.search(r"seed 0: took \d+ s \([\d.]+ s a round\)", log), log
    out = tmp_path / "out"
    journal = out / "tune" / "studies.journal"
    chosen = _trials(out)["default/server_sl"]

    def row() -> str:  # the study's row of the report's Tuning table
        text = (out / "tuned.md").read_text().split("### Tuning")[1]
        return next(line for line in text.splitlines() if line.startswith("| default |"))

    tuned = row()
    # (1) the last record cut mid line
    whole = journal.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    journal.write_bytes(whole[: len(whole) - len(last) // 2 - 1])
    main(["compare", f"--config={spec}"])
    assert capsys.readouterr().err.count("was cut short") == 1
    assert (out / "tune" / "studies.journal.torn").is_file()
    assert _trials(out)["default/server_sl"] == chosen
    assert row() == tuned
    lines = journal.read_bytes().splitlines(keepends=True)
    cut = b"".join([*lines[:2], lines[2][:10] + b"\n", *lines[3:]])
    journal.write_bytes(cut)
    err = refused(["compare", f"--config={spec}"], capsys)
    assert f"line 3 of {journal} is not a whole Optuna record" in err, err
    assert journal.read_bytes() == cut
    journal.write_bytes(b"".join(lines))
    # (2) a trial's value edited in the journal
    edited = []
    for line in lines:
        record = json.loads(line)
        if record.get("values"):
            record["values"] = [0.999]
        edited.append(json.dumps(record).encode() + b"\n")
    journal.write_bytes(b"".join(edited))
    main(["compare", f"--config={spec}"])
    best = max(v for s, _, v in chosen if s == "COMPLETE")
    assert "99.90" not in row() and f"| {100 * best:.2f} |" in row()
    # (1b) cut inside the record of the study's terms: its trials told again, not "another space"
    assert json.loads(lines[1]).get("user_attr", {}).get("fedlit_terms") is not None
    journal.write_bytes(lines[0] + lines[1][:40])
    main(["compare", f"--config={spec}"])
    assert _trials(out)["default/server_sl"] == chosen and row() == tuned
    # (3) every trial's checkpoint deleted
    for ckpt in (out / "tune").rglob("last.ckpt"):
        ckpt.unlink()
    main(["compare", f"--config={spec}"])
    assert "*val n, SE* and *flip* not measured" in (out / "tuned.md").read_text()


def test_the_time_left_is_estimated_from_the_runs_measured() -> None:
    """10 s for 2 rounds, then 30 s for 2: 10 s a round; 3 runs of 2 rounds left: 1 minute."""
    from fedlit.comparison.runner import timing

    assert timing([(10.0, 2)], []) == "took 10 s (5.0 s a round)"
    text = timing([(10.0, 2), (30.0, 2)], [2, 2, 2])
    assert text == "took 30 s (15.0 s a round); the 3 runs left: about 1.0 min at this pace"


def test_a_rerun_logs_the_tuning_into_the_same_wandb_run(tmp_path: Path) -> None:
    """W&B once got a new ``<name>/tuning`` run at each re-run of a finished comparison: its
    id is now one per comparison's folder, and not the results run's."""
    from fedlit.comparison import Comparison
    from fedlit.comparison.report import rerun_id
    from fedlit.comparison.spec import WandbSettings
    from fedlit.comparison.tune_report import log_tuning_to_wandb

    calls, init = recording_wandb_init(tmp_path)
    for out in ("a", "a", "b"):
        comparison = Comparison(
            name="c", recipes=RECIPES, baseline="server_sl", out=str(tmp_path / out),
            wandb=WandbSettings(project="p", offline=True),
        )  # fmt: skip
        log_tuning_to_wandb(comparison, [], {}, init=init)
    ids = [call["id"] for call in calls]
    assert ids[0] == ids[1] != ids[2] and calls[0]["resume"] == "allow"
    assert ids[0] != rerun_id("p", "c", tmp_path / "a")  # the results run's


def test_the_halving_pruner_sees_each_round_once_as_the_mean_over_two_tuning_seeds(
    tmp_path: Path,
) -> None:
    """A trial on two tuning seeds reports, at round r's step, the mean of the seeds' round-r
    scores, once per step: the halving pruner completes one rung per step it reaches (not
    the many rungs a step offset by seed would pass at once), and the earlier seed's run
    reports nothing."""
    from types import SimpleNamespace

    from fedlit.comparison import Comparison, TuneSettings, plan, studies
    from fedlit.federation.trial import make_pruner, open_storage, trial_callbacks

    tune = TuneSettings(trials=3, seeds=[100, 101], pruner="halving", warmup_rounds=1)
    comparison = Comparison(
        name="c", recipes=RECIPES[:1], baseline="server_sl", out=str(tmp_path), tune=tune
    )
    studies.storage_path(comparison).parent.mkdir(parents=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=studies.study_name(comparison, "default", "server_sl"),
        storage=open_storage(studies.storage_path(comparison)),
        direction="maximize",
        pruner=make_pruner(studies.pruner_rule(tune)),
    )
    study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    bases = plan(studies.tuning_comparison(comparison))
    runs = [studies.trial_run(comparison, base, 0, {"x": 0.5}) for base in bases]
    scores = {100: [0.1, 0.5, 0.6], 101: [0.2, 0.7, 0.9]}  # rounds 0, 1, 2 of each seed
    first, last = runs
    first.run_dir.mkdir(parents=True)
    meta = {"method": "server_sl", "seed": 100, "rounds": 2}
    (first.run_dir / "run.json").write_text(json.dumps(meta))
    (first.run_dir / "metrics.csv").write_text(
        "round,val/acc\n" + "".join(f"{r},{v}\n" for r, v in enumerate(scores[100]))
    )
    for run in runs:
        [callback] = trial_callbacks(dict(run.trial_labels))
        view = SimpleNamespace(history=[], run_dir=run.run_dir, config=SimpleNamespace(rounds=2))
        for r, value in enumerate(scores[run.seed]):
            view.history.append({"round": float(r), "val/acc": value})
            if r:
                callback.on_round_end(view, r, {})
        if run is first:  # the earlier seed's run: nothing reported
            assert study.trials[0].intermediate_values == {}
    trial = study.trials[0]
    assert trial.intermediate_values == pytest.approx({0: 0.15, 1: 0.6, 2: 0.75})
    # round 1 reached rung 0 (min_resource 1); round 2, the last, asks no pruner
    assert sorted(k for k in trial.system_attrs if "rung" in k) == ["completed_rung_0"]
    assert trial.system_attrs["completed_rung_0"] == pytest.approx(0.6)


def test_one_sampler_per_study_draws_what_a_sampler_seeded_per_trial_draws() -> None:
    """The study's one sampler draws, trial by trial, what a TPE sampler seeded with the
    sampler's seed and the trial's number draws (the settings an earlier fedlit chose), and a
    study loaded afresh with a new sampler draws its next trial as the running one would."""
    from fedlit.comparison.sampler import draw_seed, number_seeded_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "lr": optuna.distributions.FloatDistribution(0.01, 1.0, log=True),
        "epochs": optuna.distributions.IntDistribution(1, 5),
    }
    storage = optuna.storages.InMemoryStorage()
    ours = optuna.create_study(
        study_name="s", storage=storage, direction="maximize", sampler=number_seeded_sampler(7, 2)
    )
    reseeded = optuna.create_study(direction="maximize")
    for n in range(6):
        reseeded.sampler = optuna.samplers.TPESampler(seed=draw_seed(7, n), n_startup_trials=2)
        mine, theirs = ours.ask(space), reseeded.ask(space)
        assert mine.params == theirs.params
        value = -abs(np.log(mine.params["lr"]) + 2.0) + mine.params["epochs"] / 10
        ours.tell(mine, value)
        reseeded.tell(theirs, value)
    sampler = number_seeded_sampler(7, 2)
    loaded = optuna.load_study(study_name="s", storage=storage, sampler=sampler)
    reseeded.sampler = optuna.samplers.TPESampler(seed=draw_seed(7, 6), n_startup_trials=2)
    assert loaded.ask(space).params == reseeded.ask(space).params
