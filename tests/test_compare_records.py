"""A comparison kept as its runs' records (``--save_records``: no checkpoints but its
sources') goes on elsewhere from them (``--restore_records``): its finished runs count as
finished and its report is the same; a record is never removed, and a record it cannot go
on from is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import refused
from test_compare_changed import REPO, digits_spec

from fedlit.cli import main

SERVER_SL = str(REPO / "recipes/server_sl.yaml")
PLATEAU = {"recipe": SERVER_SL, "folder": "plateau"}


def _scores(out: Path, method: str) -> list[str]:
    """The report's row of ``method`` (``digits.csv``): its scores, not its run times."""
    lines = (out / "digits.csv").read_text().splitlines()
    head = lines[0].split(",")
    row = next(
        line.split(",") for line in lines[1:] if line.split(",")[head.index("method")] == method
    )
    return [cell for h, cell in zip(head, row, strict=True) if "acc" in h]


def test_records_carry_a_warm_started_comparison_to_a_new_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Server-SL run from its source and saved for the spec that adds FedAvg-FixMatch; a new
    out restored from the records runs FedAvg-FixMatch and the every-label row alone, from the
    restored source's checkpoint (Server-SL and the source finished), and reports Server-SL as
    the first out did. Saved runs hold no checkpoint; the source keeps its own only while a
    run from it is still to run. A fit into a restored run's folder is refused, the record
    kept."""
    alone = digits_spec(tmp_path, init_from=PLATEAU, recipes=[SERVER_SL], baseline=None)
    main(["compare", f"--config={alone}"])
    first = _scores(tmp_path / "out", "server_sl")
    ended = tmp_path / "ended"  # every run finished: the source's checkpoint is not kept
    main(["compare", f"--config={alone}", f"--save_records={ended}"])
    assert not (ended / "default" / "plateau" / "seed0" / "checkpoints").exists()
    both = digits_spec(tmp_path, init_from=PLATEAU, every_label=True)
    records = tmp_path / "records"  # saved for the spec that goes on: FedAvg-FixMatch to run
    main(["compare", f"--config={both}", f"--save_records={records}"])
    assert "2 finished run(s) saved" in capsys.readouterr().out
    run = records / "default" / "server_sl" / "seed0"
    assert sorted(p.name for p in run.iterdir()) == [
        "config.yaml", "hparams.yaml", "metrics.csv", "record.json", "run.json",
    ]  # fmt: skip
    assert json.loads((run / "record.json").read_text()) == {"round": 1}
    source = json.loads((run / "run.json").read_text())["init_from"]["path"]
    assert source == "../../plateau/seed0/checkpoints/last.ckpt"  # from the run's folder
    assert (records / "default" / "plateau" / "seed0" / "checkpoints" / "last.ckpt").is_file()
    main(["compare", f"--config={both}", f"--save_records={records}"])  # saved already
    assert "0 finished run(s) saved" in capsys.readouterr().out

    new = tmp_path / "new"
    main(["compare", f"--config={both}", f"--out={new}", f"--restore_records={records}"])
    shown = capsys.readouterr().out
    assert "2 finished run(s) restored" in shown
    assert shown.count("finished, skipped") == 2 and "fedavg_fixmatch seed 0: fedlit fit" in shown
    assert _scores(new, "server_sl") == first
    # an untuned comparison's every_label row: run, reported, and saved with the others
    assert "server_sl_every_label seed 0: fedlit fit" in shown
    report = (new / "digits.md").read_text()
    assert "| server_sl_every_label |" in report
    assert "| `default/plateau/seed0/checkpoints/last.ckpt` |" in report
    assert "| 3 (default seed 0) |" in report  # restored and new runs: one source
    main(["compare", f"--config={both}", f"--out={new}", f"--save_records={tmp_path / 'r2'}"])
    assert "4 finished run(s) saved" in capsys.readouterr().out
    source = json.loads((new / "default" / "fedavg_fixmatch" / "seed0" / "run.json").read_text())
    assert str(new / "default" / "plateau" / "seed0") in json.dumps(source)
    kept = new / "default" / "server_sl" / "seed0"
    assert not (kept / "checkpoints").exists()
    before = {p: p.read_bytes() for p in kept.iterdir()}
    err = refused(
        ["fit", f"--config={kept / 'config.yaml'}", f"--trainer.default_root_dir={kept}"], capsys
    )
    assert f"{kept} already holds a run" in err
    assert {p: p.read_bytes() for p in kept.iterdir()} == before


def test_a_record_short_of_the_rounds_and_a_source_without_its_checkpoint_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restored run whose record ends before the spec's rounds cannot go on: refused by
    name, nothing written; with --rerun_changed it is set aside, never deleted. A run to run
    whose source is a record without its checkpoint is refused by name."""
    spec = digits_spec(tmp_path, recipes=[SERVER_SL], baseline=None)
    main(["compare", f"--config={spec}"])
    records = tmp_path / "records"
    main(["compare", f"--config={spec}", f"--save_records={records}"])
    new = tmp_path / "new"
    longer = ["--overrides+=--federation.rounds=2"]
    main(["compare", f"--config={spec}", f"--out={new}", f"--restore_records={records}"])
    run = new / "default" / "server_sl" / "seed0"
    before = {p: p.read_bytes() for p in run.iterdir()}
    err = refused(["compare", f"--config={spec}", f"--out={new}", *longer], capsys)
    assert f"{run}: kept as its record alone, which ends before round 2" in err
    assert {p: p.read_bytes() for p in run.iterdir()} == before
    main(["compare", f"--config={spec}", f"--out={new}", *longer, "--rerun_changed=true"])
    assert sorted(p.name for p in run.with_name("seed0.changed1").iterdir()) == sorted(
        p.name for p in before
    )

    warm = digits_spec(tmp_path / "warm", recipes=[SERVER_SL], baseline=None, init_from=PLATEAU)
    main(["compare", f"--config={warm}", "--seeds=[0]"])
    saved = tmp_path / "warm_records"
    main(["compare", f"--config={warm}", f"--save_records={saved}"])
    # every run finished: the source is saved without its checkpoint
    assert not (saved / "default" / "plateau" / "seed0" / "checkpoints").exists()
    elsewhere = tmp_path / "elsewhere"
    main(["compare", f"--config={warm}", f"--out={elsewhere}", f"--restore_records={saved}"])
    capsys.readouterr()
    (elsewhere / "default" / "server_sl" / "seed0" / "record.json").unlink()  # not finished
    for name in ("metrics.csv", "config.yaml", "hparams.yaml", "run.json"):
        (elsewhere / "default" / "server_sl" / "seed0" / name).unlink()
    err = refused(["compare", f"--config={warm}", f"--out={elsewhere}"], capsys)
    assert "its warm start's source" in err and "without its checkpoint" in err


def test_records_inside_out_both_flags_and_a_missing_folder_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything is copied: records inside out, both flags at once, no such folder."""
    spec = digits_spec(tmp_path, recipes=[SERVER_SL], baseline=None)
    out = tmp_path / "out"
    err = refused(["compare", f"--config={spec}", f"--save_records={out / 'r'}"], capsys)
    assert "records=" in err and "outside out" in err
    err = refused(
        ["compare", f"--config={spec}", "--save_records=a", "--restore_records=b"], capsys
    )
    assert "give one of them" in err
    err = refused(["compare", f"--config={spec}", f"--restore_records={tmp_path / 'no'}"], capsys)
    assert "no such folder" in err
    assert not out.exists()
