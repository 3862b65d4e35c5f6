"""Every recipe through the real CLI on CPU, and bad input rejected before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fedlit.cli import COMMANDS, main
from fedlit.federation import TrainerTemplate

RECIPES = sorted(
    p
    for p in Path(__file__).parents[1].joinpath("recipes").rglob("*.yaml")
    if p.parent.name != "comparisons"  # comparison specs: tests/test_comparison.py
)


def tiny(
    root: Path, run_dir: Path, recipe: Path | None = None, dataset: str = "fashion_mnist"
) -> list[str]:
    """Overrides that shrink any recipe to one tiny round on ``dataset``: the local
    Fashion-MNIST, or the generated ``synthetic`` (28x28 grey as well, no files needed).

    Paper recipes name data sets that are downloaded on a user's machine; here they run on
    ``dataset``, and a backbone that needs 32x32 RGB input is swapped for the small CNN.
    A recipe's full round (its own data set and scale) needs that download and, for
    ResNet-18, a GPU.
    """
    args = [
        f"--data.dataset={dataset}",
        f"--data.root={root}",
        "--data.num_clients=2",
        "--data.examples_per_client=32",
        "--data.client_batch_size=16",
        "--data.labeled_per_class=5",
        "--data.labeled_fraction=null",
        "--data.val_per_class=2",
        "--data.test_subset=200",
        "--federation.rounds=1",
        "--federation.clients_per_round=2",
        "--federation.local_epochs=1",
        "--federation.server_epochs=1",
        "--federation.eval_epochs=1",
        f"--trainer.default_root_dir={run_dir}",
    ]
    if recipe is not None:
        config = yaml.safe_load(recipe.read_text())
        backbone = config["model"]["init_args"].get("network", {}).get("backbone")
        partitioner = config["data"].get("partitioner", {}).get("class_path", "")
        if partitioner.endswith("SSFL"):  # one main user per class
            args += ["--data.num_clients=10", "--federation.clients_per_round=10"]
        if config["federation"].get("local_steps"):
            args.append("--federation.local_steps=2")
        if "bootstrap_epochs" in config["model"]["init_args"]:
            args.append("--model.init_args.bootstrap_epochs=1")
        if config["data"].get("server_unlabeled_fraction"):  # 60 images, not 3,000
            fraction = 0.001 if dataset == "fashion_mnist" else 0.01  # of 60,000 or 6,000
            args.append(f"--data.server_unlabeled_fraction={fraction}")
        # ResNet-18 and ResNet-9 run here once each (FedSup and FedSEAL, CIFAR-10 IID);
        # elsewhere they are swapped to keep the suite fast
        kept = ("fedsup_cifar10_iid.yaml", "fedseal_cifar10_iid.yaml")
        slow = backbone in ("resnet18", "resnet9") and recipe.name not in kept
        if backbone == "fedcon_cifar_cnn" or slow:
            args.append("--model.init_args.network.backbone=small_cnn")
        if config["data"].get("path"):  # the user's files (recipes/examples): the generated
            # data set here; tests/test_user_data.py runs them on generated folders
            args += ["--data.path=null", "--data.image_size=null"]
    return args


def two_tiny_rounds(root: Path, run_dir: Path, recipe: Path) -> list[str]:
    """The command that fits ``recipe`` for two rounds of :func:`tiny` in a process of its own
    (also ``benchmarks/recipe_equality.py``'s)."""
    return [
        sys.executable,
        "-m",
        "fedlit",
        "fit",
        f"--config={recipe}",
        *tiny(root, run_dir, recipe),
        "--federation.rounds=2",
    ]


def test_recipes_exist() -> None:
    names = {p.name for p in RECIPES}
    assert {"quickstart.yaml", "server_sl.yaml", "fedavg_sl.yaml", "fedavg_fixmatch.yaml"} <= names
    assert {f"{m}.yaml" for m in ("fedavg_simclr", "fedavg_simsiam", "fedavg_byol")} <= names
    assert {"fedcon.yaml", "fedsup.yaml"} <= names
    assert {
        f"{m}.yaml"
        for m in ("fedavg_uda", "fedprox_fixmatch", "fedrgd", "fedseal", "fedswitch")
        + ("ts_server_ema", "ts_client_ema")
    } <= names
    papers = {p.name for p in RECIPES if p.parent.name == "papers"}
    assert {
        f"fedcon_{d}_{s}.yaml" for d in ("mnist", "cifar10", "svhn") for s in ("iid", "noniid")
    } <= papers
    assert {"fedseal_cifar10_noniid.yaml", "ssfl_cifar10.yaml"} <= papers
    table1 = {p.stem for p in RECIPES if p.parent.name == "paper002_fmnist"}  # paper 002 Table 1
    assert table1 == {"server_sl", "fedavg_sl", "fedavg_fixmatch", "fedavg_uda", "fedseal"}
    # paper 000 on CIFAR-100 and STL-10, paper 001 section IV-E, paper 004 on SVHN and EMNIST
    ssl = ("fedsup", "fedavg_fixmatch", "fedavg_simclr", "fedavg_simsiam", "fedavg_byol")
    assert {f"{m}_cifar100_iid.yaml" for m in (*ssl, "fedavg_sl")} <= papers
    assert {f"{m}_stl10.yaml" for m in (*ssl, "server_sl")} | {"server_sl_cifar100.yaml"} <= papers
    protocols = {"fedcon_mnist_iid_server_unlabeled.yaml", "ssfl_svhn.yaml", "ssfl_emnist.yaml"}
    assert protocols <= papers
    assert {
        f"fedswitch_cifar10_{s}_labels_at_{w}.yaml"
        for s in ("batch_iid", "batch_noniid")
        for w in ("server", "client")
    } <= papers


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_recipe_runs_one_tiny_round(
    recipe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every recipe runs, on the generated data set: no download, no Debian package."""
    run_dir = tmp_path / "run"
    tiny_round = tiny(tmp_path / "data", run_dir, recipe, dataset="synthetic")
    main(["fit", f"--config={recipe}", *tiny_round])
    printed = capsys.readouterr()
    final = json.loads(printed.out.strip().splitlines()[-1])
    assert 0.0 <= final["test/acc"] <= 1.0
    # then, in words: the rounds, test/acc in percent, and the baseline to beat and how
    closing = printed.err.strip().splitlines()
    rounds = int(final["round"])
    done = [line for line in closing if line.startswith(f"fedlit fit: {rounds} rounds in ")]
    assert done and f"test/acc {100 * final['test/acc']:.2f}% at the last round" in done[0]
    server_only = "fedlit.methods.ServerSL" in recipe.read_text()
    assert any("--model=fedlit.methods.ServerSL" in line for line in closing) != server_only
    assert (run_dir / "metrics.csv").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_print_config_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                "--config=recipes/quickstart.yaml",
                "--federation.rounds=5",
                "--federation.clients_per_round=3",
                "--federation.local_epochs=2",
                "--federation.server_epochs=4",
                "--data.num_clients=7",
                "--data.dataset=mnist",
                "--trainer.default_root_dir=somewhere",
                "--seed_everything=123",
                "--print_config",
            ]
        )
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for line in (
        "rounds: 5",
        "clients_per_round: 3",
        "local_epochs: 2",
        "server_epochs: 4",
        "num_clients: 7",
        "dataset: mnist",
        "default_root_dir: somewhere",
        "seed_everything: 123",
    ):
        assert line in out, line


BAD = [
    (["--data.num_clients=0"], "data.num_clients"),
    (["--data.num_clients=-2"], "data.num_clients"),
    (["--federation.clients_per_round=11"], "federation.clients_per_round"),
    (["--data.partitioner=Dirichlet", "--data.partitioner.alpha=0"], "alpha"),
    (["--data.partitioner=Dirichlet", "--data.partitioner.alpha=-1"], "alpha"),
    (["--data.labeled_per_class=7000"], "data.labeled_per_class"),
    (["--data.dataset=imagenet"], "data.dataset"),
    (["--data.partitioner=NoSuchPartitioner"], "data.partitioner"),
    (["--federation.rounds=0"], "federation.rounds"),
    (["--model.init_args.optim.client_lr=0"], "optim.client_lr"),
]


@pytest.mark.parametrize(("args", "key"), BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_exits_before_work_naming_the_key(
    args: list[str], key: str, fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "fit",
                "--config=recipes/quickstart.yaml",
                f"--data.root={fmnist_root}",
                f"--trainer.default_root_dir={run_dir}",
                *args,
            ]
        )
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert key in err, err
    assert "Traceback" not in err
    assert not run_dir.exists()  # nothing written


def test_existing_run_is_not_overwritten(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    args = ["fit", "--config=recipes/server_sl.yaml", *tiny(fmnist_root, run_dir)]
    main(args)
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code != 0
    assert "already holds a run" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


def test_test_subcommand_evaluates_a_checkpoint(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    main(["fit", "--config=recipes/server_sl.yaml", *tiny(fmnist_root, run_dir)])
    fit_final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ckpt = f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    main(["test", f"--config={run_dir / 'config.yaml'}", ckpt])
    tested = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tested["test/acc"] == pytest.approx(fit_final["test/acc"])
    assert tested["round"] == 1
    # another split than the run's (the recipe's own labels) is refused, naming the key
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config=recipes/server_sl.yaml", f"--data.root={fmnist_root}", ckpt])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "test: data.examples_per_client=1200, the run had 32" in err


#: The ``trainer`` group of a run directory's config.yaml as fedlit wrote it while a Lightning
#: Trainer parsed the group: every Trainer argument, at Lightning's default.
EARLIER_TRAINER = """\
trainer:
  accelerator: auto
  strategy: auto
  devices: auto
  num_nodes: 1
  precision: null
  logger: false
  callbacks: null
  fast_dev_run: false
  max_epochs: null
  min_epochs: null
  max_steps: -1
  min_steps: null
  max_time: null
  limit_train_batches: null
  limit_val_batches: null
  limit_test_batches: null
  limit_predict_batches: null
  overfit_batches: 0.0
  val_check_interval: null
  check_val_every_n_epoch: 1
  num_sanity_val_steps: null
  log_every_n_steps: null
  enable_checkpointing: null
  enable_progress_bar: null
  enable_model_summary: null
  accumulate_grad_batches: 1
  gradient_clip_val: null
  gradient_clip_algorithm: null
  deterministic: null
  benchmark: null
  inference_mode: true
  use_distributed_sampler: true
  profiler: null
  detect_anomaly: false
  barebones: false
  plugins: null
  sync_batchnorm: false
  reload_dataloaders_every_n_epochs: 0
  default_root_dir: {run_dir}
  enable_autolog_hparams: true
  model_registry: null
"""


def test_a_run_config_of_an_earlier_fedlit_is_read(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its Lightning Trainer arguments that fedlit never applied are dropped where they hold
    Lightning's default (``fedlit test`` and a resume read it), and refused by name where not."""
    run_dir = tmp_path / "run"
    main(["fit", "--config=recipes/server_sl.yaml", *tiny(fmnist_root, run_dir)])
    fit_final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["trainer"] = yaml.safe_load(EARLIER_TRAINER.format(run_dir=run_dir))["trainer"]
    assert len(config["trainer"]) == 41 and config["trainer"]["max_epochs"] is None
    earlier = tmp_path / "earlier.yaml"
    earlier.write_text(yaml.safe_dump(config, sort_keys=False))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    main(["test", f"--config={earlier}", f"--ckpt_path={ckpt}"])
    tested = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tested["test/acc"] == pytest.approx(fit_final["test/acc"])
    main(["fit", f"--config={earlier}", f"--federation.resume={ckpt}", "--federation.rounds=2"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["round"] == 2
    config["trainer"]["max_epochs"] = 5
    earlier.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(SystemExit) as exit_info:
        main(["test", f"--config={earlier}", f"--ckpt_path={ckpt}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: trainer.max_epochs=5: a Lightning Trainer setting fedlit never applied" in err


def test_wandb_offline(fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            "--config=recipes/server_sl.yaml",
            *tiny(fmnist_root, run_dir),
            "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.project=fedlit-test",
        ]
    )
    runs = list(tmp_path.glob("wandb/offline-run-*"))
    assert len(runs) == 1
    assert any(runs[0].rglob("*.wandb"))
    assert (run_dir / "metrics.csv").is_file()  # the CSV log is kept beside W&B


def test_console_script_reports_bad_input_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedlit",
            "fit",
            "--config=recipes/quickstart.yaml",
            "--data.num_clients=0",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        timeout=300,
    )
    assert proc.returncode != 0
    assert "data.num_clients" in proc.stderr and "Traceback" not in proc.stderr


def test_a_teacher_in_eval_mode_is_not_reported_to_the_user(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """TSServerEMA's clients hold their teacher in eval mode on purpose (from the worker's
    second fit on); Lightning's "Found N module(s) in eval mode" warning is not shown."""
    recipe = Path(__file__).parents[1] / "recipes" / "ts_server_ema.yaml"
    proc = subprocess.run(
        two_tiny_rounds(fmnist_root, tmp_path / "run", recipe),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "eval mode" not in proc.stderr + proc.stdout


def test_a_run_stopped_by_sigterm_exits_with_143(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning stops on SIGTERM with a bare SystemExit (status 0); the console script says
    the run was terminated, so a scheduler or a shell script does not take it for done."""

    def terminated(_: list[str]) -> None:
        raise SIGTERMException

    monkeypatch.setitem(COMMANDS, "report", terminated)
    with pytest.raises(SystemExit) as exc:
        main(["report", "anything"])
    assert exc.value.code == 143


def test_trainer_settings_reach_every_fit_or_are_refused(
    fmnist_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``trainer.*`` setting reaches every server and client fit and every evaluation (in
    fedlit's loop); one the federation would not apply (a Trainer's own length, callbacks,
    ...) exits 2 naming it, before anything is written."""
    run_dir = tmp_path / "run"
    base = ["fit", "--config=recipes/fedavg_fixmatch.yaml", *tiny(fmnist_root, run_dir)]
    built: list[object] = []
    original = TrainerTemplate.loop

    def loop(self: TrainerTemplate) -> Any:
        settings = original(self)
        built.append(settings.limit_train_batches)
        return settings

    monkeypatch.setattr(TrainerTemplate, "loop", loop)
    main([*base, "--trainer.limit_train_batches=1"])
    assert built and set(built) == {1}  # every server, client and evaluation fit
    for bad in ("--trainer.max_epochs=3", "--trainer.fast_dev_run=true", "--trainer.callbacks=[]"):
        other = tmp_path / "refused"
        with pytest.raises(SystemExit) as exit_info:
            main([*base, f"--trainer.default_root_dir={other}", bad])
        assert exit_info.value.code == 2
        key = bad.split("=")[0].removeprefix("--")
        err = capsys.readouterr().err
        assert key in err
        if bad != "--trainer.callbacks=[]":  # a Trainer's own key: what fedlit's loop takes
            assert "its trainer settings: accelerator, devices, precision" in err, err
        assert not other.exists()
