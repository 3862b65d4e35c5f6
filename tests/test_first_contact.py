"""A new user's first hour: ``fedlit --help`` at once, a line as soon as ``fedlit fit`` starts,
progress lines off a terminal from the data on, a built-in recipe moved onto one's own folder
refused once with every setting to change, a warning for clients smaller than a batch, and
the comparison spec that answers "which method?" on one's own folder."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from test_image_cache import SIZE, photo, write_png
from test_progress import _tiny

import fedlit
from fedlit.cli import main, starting_line
from fedlit.data import FederatedDataModule
from fedlit.federation.callbacks import Announce
from fedlit.methods import FedAvgFixMatch, FedSEAL, ServerSL
from fedlit.models import Architecture

REPO = Path(__file__).parents[1]


def _imports(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return {name.split(".")[0] for name in done.stdout.split()}


def test_fedlit_help_imports_neither_torch_nor_lightning() -> None:
    loaded = _imports(
        "from fedlit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert "fedlit" in loaded
    assert not loaded & {"torch", "lightning", "jsonargparse", "numpy"}


def test_version_fit_help_and_a_misspelt_command_answer_without_torch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``fedlit --version``, ``fedlit fit --help`` (the recipe's groups, and where every
    setting is listed) and ``fedlit fitt`` (refused naming every command, and the nearest)
    import neither torch nor Lightning."""
    for argv in (["--version"], ["fit", "--help"], ["fitt"]):
        code = (
            f"from fedlit.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
        )
        assert not _imports(code) & {"torch", "lightning", "jsonargparse"}, argv
    with pytest.raises(SystemExit) as end:
        main(["--version"])
    assert end.value.code == 0 and capsys.readouterr().out == f"fedlit {fedlit.__version__}\n"
    with pytest.raises(SystemExit) as end:
        main(["fit", "--help"])
    shown = capsys.readouterr().out
    assert end.value.code == 0 and len(shown.splitlines()) < 40
    for group in ("model", "data", "federation", "trainer", "seed_everything"):
        assert f"\n  {group} " in shown, group
    assert "fedlit fit --config recipes/quickstart.yaml --help" in shown
    with pytest.raises(SystemExit) as end:
        main(["fitt", "--config", "recipes/quickstart.yaml"])
    err = capsys.readouterr().err
    assert end.value.code == 2
    assert "'fitt' is not a command (choose from fit, test, compare, report, partition)" in err
    assert "did you mean 'fit'?" in err


def test_fit_says_what_it_does_before_importing_torch(tmp_path: Path) -> None:
    """The first line comes from ``fedlit.cli`` alone; ``--help`` and ``--print_config`` only
    print, and say nothing first."""
    line = starting_line(["fit", "--config", "recipes/quickstart.yaml"])
    assert line is not None and line.startswith("fedlit fit: training a federation from")
    assert "recipes/quickstart.yaml" in line
    short = starting_line(["test", "-c", "a.yaml", "--config=b.yaml"])  # as the parser reads them
    assert short is not None and short.startswith(
        "fedlit test: testing a checkpoint from a.yaml, b.yaml;"
    )
    assert starting_line(["fit", "--config=r.yaml", "--print_config"]) is None
    assert starting_line(["fit", "--help"]) is None
    assert starting_line(["report", "runs/x"]) is None
    assert starting_line(["fit", "--model.help", "FedSEAL"]) is None
    compare = starting_line(["compare", "--config", "spec.yaml"])  # 6-10 s of imports follow
    assert compare is not None
    assert compare.startswith("fedlit compare: running a comparison from spec.yaml;")
    assert "spec.yaml" in compare
    process = subprocess.Popen(
        [sys.executable, "-m", "fedlit", "fit", "--config", "recipes/quickstart.yaml"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        alive = process.poll() is None  # still importing: the line came first
    finally:
        process.kill()
        process.wait()
    assert first.strip() == line and alive


def test_a_command_run_as_a_module_or_in_process_is_named_fedlit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m fedlit`` and an in-process call (the site's CLI page) print ``usage:
    fedlit``, not the name of the program that runs them (``__main__.py``)."""
    done = subprocess.run(
        [sys.executable, "-m", "fedlit", "fit", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: fedlit "), done.stdout[:80]
    with pytest.raises(SystemExit):
        main(["test", "--help"])
    assert capsys.readouterr().out.startswith("usage: fedlit [options] test")


def _folder(root: Path, train: int, test: int = 1) -> Path:
    for split, count in (("train", train), ("test", test)):
        for c in range(2):
            folder = root / split / f"cat{c}"
            folder.mkdir(parents=True)
            for n in range(count):
                write_png(photo(c + n, SIZE, SIZE), str(folder / f"{n}.png"))
    return root


def test_a_recipe_too_large_for_a_folder_is_refused_once_naming_every_setting(
    tmp_path: Path,
) -> None:
    """The labeled set a class cannot hold and the clients the pool cannot fill, in one
    refusal: the user changes both at once."""
    given = {"root": str(tmp_path / "data"), "path": str(_folder(tmp_path / "mine", 6))}
    with pytest.raises(ValueError) as refused:
        FederatedDataModule(
            "folder", **given, image_size=SIZE, labeled_per_class=7, examples_per_client=5
        )
    message = str(refused.value)
    assert "data.labeled_per_class=7" in message and "data.examples_per_client=5" in message


def test_clients_smaller_than_a_batch_are_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = FederatedDataModule(
        "folder",
        root=str(tmp_path / "data"),
        path=str(_folder(tmp_path / "mine", 8)),
        image_size=SIZE,
        labeled_per_class=2,
        val_per_class=0,
        num_clients=3,
        client_batch_size=4,
    )
    data.setup_federation(0)
    sizes = sorted(len(shard) for shard in data.clients)  # 12 images left for 3 clients
    assert sizes == [4, 4, 4]

    def announced(method: type) -> str:
        view = SimpleNamespace(data=data, method=method(Architecture(2, 3)))
        Announce().on_run_start(view)  # type: ignore[arg-type]
        return capsys.readouterr().err

    assert "fewer images" not in announced(FedAvgFixMatch)  # a batch each: no warning
    data.client_batch_size = 5
    err = announced(FedAvgFixMatch)
    assert "3 of 3 clients hold fewer images than a batch (the smallest 4" in err
    assert "data.client_batch_size=5" in err
    assert "fewer images" not in announced(ServerSL)  # its clients do not train


def test_progress_lines_off_a_terminal_from_the_data_on(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a log file and a notebook show (no terminal: ``progress`` None): the set-up's
    stages (the data, FedSEAL's bootstrap), then each round's first stage and its end."""
    federation = _tiny(fmnist_root, tmp_path / "r", partial(FedSEAL, bootstrap_epochs=1))
    federation.progress = None  # stderr is not a terminal here
    federation.run()
    captured = capsys.readouterr()
    stages = [line for line in captured.err.splitlines() if not line.startswith("warning")]
    assert stages == [
        "set-up: loading the data (fashion_mnist) and partitioning it",
        "set-up: bootstrap before round 1 (bootstrap_epochs=1)",
        "round 1/2: client 1/2",  # FedSEAL's round starts at its clients
        "round 2/2: client 1/2",
    ]
    rounds = captured.out.splitlines()  # stdout: the results, a line per round
    assert len(rounds) == 2
    assert re.fullmatch(r"round 1/2  acc \d\.\d{4}  [\d.]+ s  about \d+ s left", rounds[0])
    assert re.fullmatch(r"round 2/2  acc \d\.\d{4}  [\d.]+ s", rounds[1])


def _spec(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / f"recipes/comparisons/{name}.yaml").read_text()))


def test_the_folder_spec_is_the_calibrated_protocol_on_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """recipes/comparisons/your_folder_warm.yaml: fmnist_warm_long_lr02's protocol, recipes,
    plateau and settings, on ``data/my_images``; its runs resolve on a folder."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan
    from fedlit.comparison.plan import plan_sources

    ours, calibrated = _spec("your_folder_warm"), _spec("fmnist_warm_long_lr02")
    folder = ["--data.dataset=folder", "--data.path=data/my_images", "--data.image_size=32"]
    assert ours["overrides"] == calibrated["overrides"] + [
        *folder,
        "--data.examples_per_client=null",
    ]
    for key in ("init_from", "recipes", "settings", "baseline", "last_k"):
        assert ours[key] == calibrated[key], key
    _folder(tmp_path / "data" / "my_images", 40)
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:  # the documented command parses
        main(
            [
                *("compare", "--config", "recipes/comparisons/your_folder_warm.yaml"),
                *("--overrides+", "[--data.path=data/my_images]", "--print_config"),
            ]
        )
    assert done.value.code == 0 and "your_folder_warm" in capsys.readouterr().out
    comparison = Comparison(**ours | {"init_from": SourceRun(**ours["init_from"])})
    runs = [r for r in plan(comparison) if r.seed == 0 and r.setting == "iid"]
    sources = [s for s in plan_sources(comparison) if s.seed == 0 and s.setting == "iid"]
    assert len(runs) == 5 and len(sources) == 1
    for run in [*runs, *sources]:
        data = resolve(run.args).config.as_dict()["data"]
        assert (data["dataset"], data["path"]) == ("folder", "data/my_images")
