"""``client/contributed`` and the warning of a round whose clients' unlabeled loss did
nothing (e.g. FixMatch with no pseudo-label above its threshold)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import tiny_overrides

from fedlit.cli import main
from fedlit.federation.callbacks import Contribution
from fedlit.methods import FedAvgFixMatch, FedAvgSimCLR, FedSEAL
from fedlit.methods.client_side import ClientUpdate

QUICKSTART = Path(__file__).parents[1] / "recipes" / "quickstart.yaml"


def _updates(*metrics: dict[str, float]) -> list[ClientUpdate]:
    return [ClientUpdate(k, {}, 1, metrics=m) for k, m in enumerate(metrics)]


def _contribution(method: Any, *metrics: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    fed: Any = SimpleNamespace(method=method)
    Contribution().on_updates(fed, 4, [], _updates(*metrics), out)
    return out


def test_contributed_is_the_fraction_of_clients_with_an_active_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fixmatch = [{"loss": 0.0, "mask_rate": 0.0}, {"mask_rate": 0.25}, {"mask_rate": 0.0}]
    assert _contribution(FedAvgFixMatch, *fixmatch) == {"client/contributed": pytest.approx(1 / 3)}
    # FedSEAL: a complementary set alone is an active loss
    seal = [{"pseudo/pos_frac": 0.0, "pseudo/neg_frac": 0.5}, {"pseudo/pos_frac": 0.0}]
    assert _contribution(FedSEAL, *seal) == {"client/contributed": 0.5}
    # SimCLR's loss has no confidence gate: every client contributes
    assert _contribution(FedAvgSimCLR, {"loss": 3.2}, {"loss": 3.1}) == {"client/contributed": 1.0}
    assert capsys.readouterr().err == ""

    idle = _contribution(FedAvgFixMatch, {"mask_rate": 0.0}, {"mask_rate": 0.0})
    assert idle == {"client/contributed": 0.0}
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # once in the round
    assert err.startswith("warning: round 4: no client's unlabeled loss was active (mask_rate 0")


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["round"] not in ("", "0", "0.0")]


@pytest.mark.parametrize("tau", [1.0, 0.0])
def test_a_run_whose_clients_did_nothing_says_so(
    tau: float, fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tau = 1: no pseudo-label of an untrained network reaches it; tau = 0: every one does."""
    run = tmp_path / "run"
    args = [*tiny_overrides(fmnist_root, rounds=2), f"--model.init_args.loss.tau={tau}"]
    main(["fit", f"--config={QUICKSTART}", *args, f"--trainer.default_root_dir={run}"])
    err = capsys.readouterr().err
    rows = _rows(run)
    assert len(rows) == 2
    for row in rows:
        mask_rate, contributed = float(row["client/mask_rate"]), float(row["client/contributed"])
        assert contributed == (1.0 if tau == 0.0 else 0.0) and (mask_rate > 0) == (tau == 0.0)
    # each evaluation scores the server's validation split too, and each step its learning rate
    for row in rows:
        assert 0 <= float(row["val/acc"]) <= 1 and float(row["val/loss"]) > 0
        assert float(row["server/lr"]) > 0 and float(row["client/lr"]) > 0
    warned = [line for line in err.splitlines() if "unlabeled loss was active" in line]
    assert len(warned) == (2 if tau == 1.0 else 0)
