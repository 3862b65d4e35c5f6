"""Every run records its server's training budget in ``run.json`` (one writer, the run's
RunFile), through the CLI and the Python API alike; reports read it from there, and a run
that records none has an unknown budget, flagged, never a measured 0."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import tiny_data, tiny_overrides
from test_compare_changed import digits_folder
from test_reporting import _budget_run, write_run

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.methods import FedAvgFixMatch, FedSEAL, ServerSL
from fedlit.models import Architecture
from fedlit.reporting import find_runs, load_run, summarize, to_markdown
from fedlit.reporting.confounds import MIXED_WARM_START, UNKNOWN_BUDGET, server_budget
from fedlit.run_layout import BUDGET_KEY

REPO = Path(__file__).parents[1]


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _data(root: Path) -> FederatedDataModule:
    """2 clients of 32 images, 10 labels a class at the server (100: batches of 64 give one
    shuffled batch an epoch), a validation image a class."""
    return tiny_data(root, labeled_per_class=10, val_per_class=1, test_subset=50)


def test_a_python_api_run_records_its_server_budget(fmnist_root: Path, tmp_path: Path) -> None:
    """Runs made as notebooks/quickstart.ipynb makes them (no config.yaml): FedAvg-FixMatch
    trains the server twice a round (a server step and a fine-tune), Server-SL once; the
    report reads their real epochs and steps and flags the difference."""
    config = FederationConfig(rounds=2, clients_per_round=2, server_epochs=3)
    methods = {"server_sl": ServerSL, "fedavg_fixmatch": FedAvgFixMatch}
    for name, method in methods.items():
        Federation(
            method(Architecture(10, 1)), _data(fmnist_root), config, tmp_path / name, seed=0
        ).run()
    record = json.loads((tmp_path / "fedavg_fixmatch" / "run.json").read_text())[BUDGET_KEY]
    assert record == {
        "epochs_per_step": 3,
        "bootstrap_epochs": 0,
        "batches_per_epoch": 1,
        "steps_per_round": ["server", "finetune"],
    }
    runs = [load_run(tmp_path / name) for name in methods]
    rows = {row.method: row for row in summarize(runs)}
    fixmatch, server = rows["FedAvgFixMatch"], rows["ServerSL"]
    assert (fixmatch.server_epochs, fixmatch.server_steps) == (12.0, 12.0)  # 2 x 2 x 3
    assert (server.server_epochs, server.server_steps) == (6.0, 6.0)  # 2 x 1 x 3
    assert "server budget: 12 epochs vs 6 epochs" in fixmatch.flags
    text = to_markdown(list(rows.values()))
    assert "| FedAvgFixMatch | 12 (4 x 3) | 12 | - |" in text
    assert "| ServerSL | 6 (2 x 3) | 6 | - |" in text


def test_a_bootstrap_and_a_warm_start_are_recorded_as_they_run(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """FedSEAL's bootstrap is in its record; a warm-started FedSEAL has none (its source is
    its w^0), and its record says so."""
    config = FederationConfig(rounds=1, clients_per_round=2)
    Federation(
        FedSEAL(Architecture(10, 1), bootstrap_epochs=2), _data(fmnist_root), config,
        tmp_path / "boot", seed=0,
    ).run()  # fmt: skip
    warm = FederationConfig(rounds=1, clients_per_round=2, init_from=str(tmp_path / "boot"))
    Federation(
        FedSEAL(Architecture(10, 1), bootstrap_epochs=2), _data(fmnist_root), warm,
        tmp_path / "warm", seed=0,
    ).run()  # fmt: skip
    boot, warmed = (load_run(tmp_path / name) for name in ("boot", "warm"))
    assert boot.budget["bootstrap_epochs"] == 2 and warmed.budget["bootstrap_epochs"] == 0
    assert server_budget(boot).describe() == "3 epochs (bootstrap 2)"  # 2 + 1 round x 1
    assert server_budget(warmed).describe() == "1 epochs"


def test_a_run_that_records_no_budget_is_unknown_and_flagged(tmp_path: Path) -> None:
    """A run written before runs recorded their budget, without a config that says it: its
    server trained (``server/*`` logged) for an unknown number of epochs, shown and flagged
    as unknown, never as 0, and no other row is flagged against it."""
    rows = [{"round": 0.0, "data/server_labeled": 20.0}]
    rows += [{"round": float(r), "test/acc": 0.5, "server/loss": 1.0} for r in (1, 2)]
    write_run(tmp_path / "old", rows, rounds=2, run_json={"method": "Old", "seed": 0})
    _budget_run(tmp_path, "New", 0, ("server",), [1.0, 1.0, 1.0])
    runs = find_runs([tmp_path])
    by_method = {row.method: row for row in summarize(runs)}
    old = by_method["Old"]
    assert old.flags == (UNKNOWN_BUDGET,)
    assert by_method["New"].flags == ()
    text = to_markdown(list(by_method.values()))
    assert "| Old | unknown (2 x unknown) | unknown | - |" in text
    assert "| Old | 0" not in text


def test_pooling_a_warm_started_seed_with_a_fresh_one_is_flagged(tmp_path: Path) -> None:
    """``fedlit report`` pools the seeds of one method and setting whatever their warm start
    (``federation.init_from`` is no setting): a row with one warm-started and one fresh run
    says so."""
    source = {"path": "/a/last.ckpt", "sha256": "ab" * 32, "method": "ServerSL", "round": 9}
    _budget_run(tmp_path, "Mixed", 0, ("server",), [1.0, 1.0, 1.0], source=source)
    _budget_run(tmp_path, "Mixed", 1, ("server",), [1.0, 1.0, 1.0])
    _budget_run(tmp_path, "Warm", 0, ("server",), [1.0, 1.0, 1.0], source=source)
    _budget_run(tmp_path, "Warm", 1, ("server",), [1.0, 1.0, 1.0], source=source)
    rows = {row.method: row for row in summarize(find_runs([tmp_path]))}
    assert rows["Mixed"].seeds == (0, 1)
    assert f"{MIXED_WARM_START}: 1/2 runs warm-started" in rows["Mixed"].flags
    assert not any(MIXED_WARM_START in flag for flag in rows["Warm"].flags)


@pytest.mark.parametrize("record", [{}, {BUDGET_KEY: {"epochs_per_step": 5}}])
def test_the_record_wins_over_the_config(tmp_path: Path, record: dict[str, object]) -> None:
    """The epochs a run recorded are the budget; a run without the record falls back to its
    config (2 epochs a step in :func:`_budget_run`)."""
    run_dir = _budget_run(tmp_path, "M", 0, ("server",), [1.0, 1.0, 1.0])
    meta = json.loads((run_dir / "run.json").read_text()) | record
    (run_dir / "run.json").write_text(json.dumps(meta))
    (row,) = summarize([load_run(run_dir)])
    assert row.server_epochs == (15.0 if record else 6.0)


def _example_spec() -> dict[str, Any]:
    """docs/comparing.md's example spec, as the page gives it."""
    page = (REPO / "docs" / "comparing.md").read_text()
    text = page.split("cat > my_comparison.yaml <<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    return dict(yaml.safe_load(text))


def test_the_example_spec_of_the_comparing_page_has_equal_budgets(
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The page's example compares FedAvg-FixMatch and FedSEAL at equal server budgets by its
    ``recipe_overrides`` (FedSEAL without its bootstrap, FedAvg-FixMatch's two server steps a
    round at half the epochs): run on tiny data (its budgets as they are, one round, one
    setting), no row is flagged for its server budget."""
    spec = _example_spec()
    tiny = [a for a in tiny_overrides(fmnist_root) if not a.startswith("--federation.server_")]
    spec |= {
        "out": str(tmp_path / "out"),
        "seeds": [0],
        "settings": {"iid": []},
        "overrides": [*spec["overrides"], *tiny],
        "wandb": None,
    }
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(REPO)
    main(["compare", f"--config={path}"])
    shown = capsys.readouterr().out
    assert "| fedavg_fixmatch | 10 (2 x 5) |" in shown and "| fedseal | 10 (1 x 10) |" in shown
    assert "server budget" not in shown


def test_the_folder_spec_flags_the_budgets_its_page_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """recipes/comparisons/your_folder_warm.yaml on a digits-like folder (one round, one
    setting and seed, a short plateau): the rows flagged for their server budget are those
    docs/which-method.md names, FedAvg-FixMatch and the joint centralized reference (a server
    step and a fine-tune a round against the others' one)."""
    recipe = REPO / "recipes/comparisons/your_folder_warm.yaml"
    spec: dict[str, Any] = yaml.safe_load(recipe.read_text())
    data = digits_folder(tmp_path / "digits", per_class=20)
    init = dict(spec["init_from"])
    init["overrides"] = [*init["overrides"], "--federation.server_epochs=2"]
    small = ["--data.num_clients=2", "--data.labeled_per_class=3", "--data.val_per_class=1"]
    small += ["--data.client_batch_size=8", "--data.hflip=false", "--federation.rounds=1"]
    small += ["--federation.clients_per_round=2", f"--data.root={tmp_path / 'cache'}"]
    spec |= {
        "out": str(tmp_path / "out"),
        "seeds": [0],
        "jobs": 1,
        "settings": {"iid": []},
        "init_from": init,
        "overrides": [*spec["overrides"], f"--data.path={data}", *small],
    }
    path = tmp_path / "folder.yaml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(REPO)
    main(["compare", f"--config={path}"])
    rows = {row["method"]: row["flags"] for row in _csv(tmp_path / "out" / "your_folder_warm.csv")}
    flagged = {method for method, flags in rows.items() if "server budget" in flags}
    assert flagged == {"fedavg_fixmatch", "centralized_fixmatch_joint"}, rows
    assert rows["centralized_fixmatch_joint"].startswith("server budget: 2 epochs vs 1 epochs")
    page = (REPO / "docs" / "which-method.md").read_text()
    assert "`server budget: 20 epochs vs 10 epochs`" in page
