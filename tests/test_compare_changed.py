"""A comparison re-run into the same ``out`` with a changed spec: each run written already is
checked against the spec's settings (a resume's comparison) before it is skipped or resumed;
a changed one is refused by name, before anything is written, or run afresh on request, the
old run set aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import refused
from torchvision.io import write_png

from fedlit.cli import main

REPO = Path(__file__).parents[1]


def digits_folder(root: Path, per_class: int = 12, test: int = 3) -> Path:
    """A digits-like folder: 8x8 grey images of 3 classes (a bright row, column or diagonal,
    with noise), as PNG files in ``train/<class>/`` and ``test/<class>/``."""
    if root.is_dir():
        return root
    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", per_class), ("test", test)):
        for c in range(3):
            folder = root / split / f"digit{c}"
            folder.mkdir(parents=True)
            for n in range(count):
                image = torch.rand(1, 8, 8, generator=generator) * 60
                if c == 0:
                    image[0, 3:5, :] += 180
                elif c == 1:
                    image[0, :, 3:5] += 180
                else:
                    image[0] += torch.eye(8) * 180
                write_png(image.clamp(0, 255).to(torch.uint8), str(folder / f"{n}.png"))
    return root


def digits_spec(tmp_path: Path, **extra: object) -> Path:
    """A comparison of Server-SL and FedAvg-FixMatch, one round on a digits folder, its out
    ``tmp_path/out`` (``extra``: the spec's other keys); its path."""
    data = digits_folder(tmp_path / "digits")
    spec = {
        "name": "digits",
        "out": str(tmp_path / "out"),
        "recipes": [str(REPO / f"recipes/{m}.yaml") for m in ("server_sl", "fedavg_fixmatch")],
        "seeds": [0],
        "baseline": "server_sl",
        "overrides": [
            "--data.dataset=folder",
            f"--data.path={data}",
            f"--data.root={tmp_path / 'cache'}",
            "--data.image_size=8",
            "--data.hflip=false",
            "--data.num_clients=2",
            "--data.examples_per_client=null",
            "--data.client_batch_size=4",
            "--data.labeled_per_class=3",
            "--data.val_per_class=1",
            "--federation.rounds=1",
            "--federation.clients_per_round=2",
            "--federation.server_epochs=1",
        ],
        **extra,
    }
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_changed_spec_refuses_its_old_runs_or_reruns_them_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spec run, then the same ``out`` with ``recipe_overrides`` equalising the server's
    budget (two epochs a round for Server-SL): refused, naming the run and the setting,
    nothing written; with ``--rerun_changed`` the changed run is set aside and run afresh,
    the unchanged one skipped, and the report shows the new budget."""
    main(["compare", f"--config={digits_spec(tmp_path)}"])
    out = tmp_path / "out"
    first = capsys.readouterr().out
    assert "server budget: 2 epochs vs 1 epochs" in first
    main(["compare", f"--config={digits_spec(tmp_path)}"])  # unchanged: both skipped
    assert capsys.readouterr().out.count("finished, skipped") == 2
    before = _files(out)
    changed = digits_spec(
        tmp_path, recipe_overrides={"server_sl": ["--federation.server_epochs=2"]}
    )
    err = refused(["compare", f"--config={changed}"], capsys)
    run = out / "default" / "server_sl" / "seed0"
    assert f"{run}: written with other settings than the spec now gives it" in err
    assert "federation.server_epochs=2, the run's 1" in err and "--rerun_changed" in err
    assert _files(out) == before  # nothing written
    main(["compare", f"--config={changed}", "--rerun_changed=true"])
    shown = capsys.readouterr().out
    assert f"settings changed, set aside in {run}.changed1" in shown
    assert "fedavg_fixmatch seed 0: finished, skipped" in shown
    aside = run.with_name("seed0.changed1")  # the old run as it was
    old = {aside / p.relative_to(run): b for p, b in before.items() if run in p.parents}
    assert _files(aside) == old
    record = json.loads((run / "run.json").read_text())["server_budget"]
    assert record["epochs_per_step"] == 2
    assert "| server_sl | 2 (1 x 2) |" in shown and "server budget:" not in shown


def test_a_warm_started_comparison_of_two_seeds_is_reused_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The settings a run is checked by are its own: its seed and its seed's warm start
    (``init_from``), not the first seed's; a re-run of the same spec skips every run, also
    with its ``out`` reached through a link. A changed source run is refused; re-run on
    request, the runs that start from it are run afresh too (their settings did not change,
    their source did)."""
    source = {"recipe": str(REPO / "recipes/server_sl.yaml"), "folder": "plateau"}
    given = {"seeds": [0, 1], "recipes": [str(REPO / "recipes/server_sl.yaml")], "baseline": None}
    spec = digits_spec(tmp_path, **given, init_from=source)
    main(["compare", f"--config={spec}"])
    capsys.readouterr()
    main(["compare", f"--config={spec}"])
    assert capsys.readouterr().out.count("finished, skipped") == 4
    link = tmp_path / "link"  # the same folder by another path: the same warm starts
    link.symlink_to(tmp_path / "out", target_is_directory=True)
    main(["compare", f"--config={spec}", f"--out={link}"])
    assert capsys.readouterr().out.count("finished, skipped") == 4
    longer = source | {"overrides": ["--federation.server_epochs=2"]}
    spec = digits_spec(tmp_path, **given, init_from=longer)
    err = refused(["compare", f"--config={spec}"], capsys)
    plateau = tmp_path / "out" / "default" / "plateau" / "seed0"
    assert f"{plateau} (and 1 other run(s)): written with other settings" in err
    main(["compare", f"--config={spec}", "--rerun_changed=true"])
    shown = capsys.readouterr().out
    assert "finished, skipped" not in shown
    for folder in ("plateau", "server_sl"):
        for seed in (0, 1):
            assert (tmp_path / "out" / "default" / folder / f"seed{seed}.changed1").is_dir()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"recipe_overrides": {"server_sl": ["--seed_everything=5"]}},
            "recipe_overrides.server_sl: '--seed_everything=5' sets seed_everything, which this "
            "comparison sets itself (the comparison gives each run its seed: list them in `seeds`)",
        ),
        (
            {"overrides": ["--trainer.default_root_dir=/elsewhere"]},
            "overrides: '--trainer.default_root_dir=/elsewhere' sets trainer.default_root_dir",
        ),
        ({"settings": {"a": ["--seed_everything", "5"]}}, "settings.a: '--seed_everything'"),
        (
            {"recipe_overrides": {"server_sl": ["--federation.labels={method: x}"]}},
            "sets federation.labels",
        ),
        (
            {
                "init_from": {
                    "recipe": "recipes/server_sl.yaml",
                    "overrides": ["--federation.init_from=r"],
                }
            },
            "init_from.overrides: '--federation.init_from=r' sets federation.init_from",
        ),
        (
            {"wandb": {"offline": True}, "overrides": ["--trainer.logger.init_args.name=x"]},
            "sets trainer.logger, which this comparison sets itself",
        ),
    ],
)
def test_an_override_of_what_the_comparison_sets_is_refused_by_name(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: dict[str, object],
    message: str,
) -> None:
    """A seed, a run directory, a run's labels, its resume, its warm start's source (with the
    spec's ``init_from``) and its logger (with ``wandb``) are the comparison's to give each
    run: an override of one would be overridden (``--seed_everything=5`` ran with seed 0)
    while the report listed it, so it is refused, naming where and what, before anything
    runs."""
    monkeypatch.chdir(REPO)
    spec = {"name": "c", "recipes": ["recipes/server_sl.yaml"], "out": str(tmp_path / "out")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec | extra))
    err = refused(["compare", f"--config={path}"], capsys)
    assert message in err, err
    assert not (tmp_path / "out").exists()
