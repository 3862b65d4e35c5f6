"""The documented W&B command (docs/getting-started.md) writes the offline run into the run
directory, not ./wandb."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_overrides

from fedlit.cli import main

RECIPE = Path(__file__).parents[1] / "recipes" / "server_sl.yaml"


def test_wandb_offline_run_lands_in_the_run_directory(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # the user's current directory
    main(
        [
            "fit",
            f"--config={RECIPE}",
            *tiny_overrides(fmnist_root),
            "--trainer.default_root_dir=runs/try",
            "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
            "--trainer.logger.project=fedlit-test",
        ]
    )
    (run,) = (tmp_path / "runs" / "try" / "wandb").glob("offline-run-*")
    assert any(run.rglob("*.wandb"))
    assert not (tmp_path / "wandb").exists()
    saved = (tmp_path / "runs" / "try" / "config.yaml").read_text()
    assert f"save_dir: {tmp_path / 'runs' / 'try'}" in saved  # the config says where it went
