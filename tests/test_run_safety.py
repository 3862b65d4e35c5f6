"""A run directory no second process can damage, a full disk, and the final line's JSON: the
real CLI on tiny runs (one or two rounds of a few batches on the local Fashion-MNIST)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_overrides

from fedlit.cli import json_line, main
from fedlit.run_layout import LOCK_FILE

RECIPES = Path(__file__).parents[1] / "recipes"


def _fit(root: Path, run_dir: Path, *extra: str, recipe: str = "server_sl") -> list[str]:
    return [
        "fit",
        f"--config={RECIPES / f'{recipe}.yaml'}",
        *tiny_overrides(root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={run_dir}",
        *extra,
    ]


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err


def _strict(line: str) -> dict[str, object]:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    out = json.loads(line, parse_constant=refuse)
    assert isinstance(out, dict)
    return out


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two finished one-round Server-SL runs (seeds 0 and 1)."""
    base = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        main(_fit(fmnist_root, base / f"seed{seed}", f"--seed_everything={seed}"))
    return base / "seed0", base / "seed1"


def test_json_line_writes_non_finite_numbers_as_null() -> None:
    line = json_line({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert _strict(line) == {"a": None, "b": [1.5, None], "c": {"d": None}}


def test_fedmatch_final_line_is_json_with_its_nan_diversity_as_null(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    main(_fit(fmnist_root, tmp_path / "run", recipe="fedmatch"))
    final = _strict(capsys.readouterr().out.strip().splitlines()[-1])
    assert "diag/weight_diversity" in final and final["diag/weight_diversity"] is None
    assert isinstance(final["test/acc"], float)


def test_a_refused_resume_into_another_runs_directory_leaves_its_lock_file(
    two_runs: tuple[Path, Path], fmnist_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = two_runs
    before = _files(second)
    assert (second / LOCK_FILE).read_text().strip().isdigit()
    resume = f"--federation.resume={first / 'checkpoints' / 'last.ckpt'}"
    err = _refused(_fit(fmnist_root, second, "--federation.rounds=2", resume), capsys)
    assert str(second) in err and "federation.resume" in err, err
    assert _files(second) == before  # its .lock too: the last writer's pid stays
