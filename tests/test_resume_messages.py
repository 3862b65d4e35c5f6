"""What a refused or a longer resume tells its user: every differing setting at once, with the
command that resumes as the run was made; a longer run's schedule laid out again."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_fit

from fedlit.cli import main
from fedlit.federation import load_checkpoint
from fedlit.federation.checkpoint import save_checkpoint

QUICKSTART = Path(__file__).parents[1] / "recipes" / "quickstart.yaml"


def _fit(root: Path, run_dir: Path, *extra: str) -> list[str]:
    return tiny_fit(QUICKSTART, root, run_dir, *extra)


def test_resume_names_every_differing_setting_and_the_runs_config(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    main(_fit(fmnist_root, run, "--model.init_args.optim.client_lr=0.05"))
    ckpt = run / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    # the recipe without the run's override, and two more changes: all three named at once
    with pytest.raises(SystemExit) as refused:
        main(
            _fit(
                fmnist_root,
                run,
                "--federation.rounds=2",
                "--data.labeled_per_class=4",
                "--federation.server_epochs=2",
                f"--federation.resume={ckpt}",
            )
        )
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "3 setting(s) differ from the checkpoint's" in err, err
    for key, now, then in [
        ("data.labeled_per_class", 4, 5),
        ("federation.server_epochs", 2, 1),
        ("model.init_args.optim.client_lr", 0.03, 0.05),
    ]:
        assert f"{key}={now!r} (the checkpoint's: {then!r})" in err, err
    assert f"--config {run.resolve() / 'config.yaml'} --federation.resume {ckpt}" in err
    assert load_checkpoint(ckpt)["round"] == 1  # nothing written

    # the suggested command, one round longer: resumed, saying the schedule is laid out again
    main(
        [
            "fit",
            f"--config={run / 'config.yaml'}",
            "--federation.rounds=2",
            f"--federation.resume={ckpt}",
        ]
    )
    err = capsys.readouterr().err
    assert (
        "federation.rounds 1 -> 2: the run-level schedules (learning rate, ramps) are laid out "
        "again over 2 rounds from round 2 on; round 1 followed the 1-round schedule, so the "
        "result differs from a fresh 2-round run"
    ) in err, err
    assert load_checkpoint(ckpt)["round"] == 2


def test_a_run_recorded_before_the_network_group_resumes_with_its_settings_compared(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint that records the network's settings at their keys before
    ``model.init_args.network`` (``model.init_args.norm``) is compared under the keys now: a
    changed norm is refused, naming it; the same settings resume."""
    run = tmp_path / "run"
    main(_fit(fmnist_root, run))
    ckpt = run / "checkpoints" / "last.ckpt"
    state = load_checkpoint(ckpt)
    state["hparams"] = {
        key.replace("model.init_args.network.", "model.init_args."): value
        for key, value in state["hparams"].items()
    }
    assert state["hparams"]["model.init_args.norm"] is None
    save_checkpoint(ckpt, state)
    capsys.readouterr()
    longer = ["--federation.rounds=2", f"--federation.resume={ckpt}"]
    with pytest.raises(SystemExit):
        main(_fit(fmnist_root, run, "--model.init_args.network.norm=bn", *longer))
    err = capsys.readouterr().err
    assert "model.init_args.network.norm='bn' (the checkpoint's: None)" in err, err
    main(_fit(fmnist_root, run, *longer))
    assert load_checkpoint(ckpt)["round"] == 2
