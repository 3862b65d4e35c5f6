"""The "Adding a method" example of the documentation (docs/contributing.md), as printed
there, through the real CLI."""

from __future__ import annotations

import csv
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import docs_example, tiny_overrides

from fedlit.cli import main

PAGE = Path(__file__).parents[1] / "docs" / "contributing.md"
MODULE = "readme_method"


@pytest.fixture
def readme_method() -> Iterator[types.ModuleType]:
    """The example's code block, importable as ``readme_method`` (so a recipe can name it)."""
    with docs_example(PAGE, "Adding a method", MODULE) as module:
        yield module


def test_readme_method_runs_from_a_recipe(
    readme_method: types.ModuleType, fmnist_root: Path, tmp_path: Path
) -> None:
    recipe = tmp_path / "my_method.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "class_path": f"{MODULE}.MyMethod",
                    "init_args": {"optim": {"client_lr": 0.03}, "loss": {"floor": 0.5}},
                },
                "data": {"dataset": "fashion_mnist"},
            }
        )
    )
    run_dir = tmp_path / "run"
    fit = ["fit", f"--config={recipe}", *tiny_overrides(fmnist_root, rounds=2)]
    main([*fit, f"--trainer.default_root_dir={run_dir}"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["round"]) for row in rows] == [0, 1, 2]  # the partition row, two rounds
    assert rows[-1]["client/mask_rate"] != ""  # its objective ran on the clients


def test_readme_method_signature_is_its_schema(
    readme_method: types.ModuleType,
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad value of the new loss setting stops the CLI, naming it, before anything is
    written; so does a key the method does not declare."""
    base = [
        "fit",
        f"--model={MODULE}.MyMethod",
        "--data.dataset=fashion_mnist",
        *tiny_overrides(fmnist_root),
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    for bad, named in (
        ("--model.init_args.loss.floor=0.99", "loss.floor"),  # above tau (0.95)
        ("--model.init_args.tau=0.5", "tau"),  # tau lives in loss, not at the top
    ):
        with pytest.raises(SystemExit) as exc:
            main([*base, bad])
        assert exc.value.code == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
