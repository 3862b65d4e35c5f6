"""The hostile-input table: bad values of every group of settings (data, model, optim, loss,
federation, ray, trainer, seed, compare, report, partition), each refused before any work with
exit status 2 and one ``error:`` line naming the key (and the value where there is one), without
jsonargparse's Union/Namespace dump, and nothing under the run's parent (the working folder)
or in an existing run changed. The CLI runs in-process; a few cases as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_overrides

from fedlit.cli import main
from fedlit.federation import TrainerTemplate
from fedlit.refusals import with_full_key
from fedlit.run_layout import enclosing_run, output_dir_error

REPO = Path(__file__).parents[1]
RECIPES = REPO / "recipes"
DUMPS = ("Union subtypes", "Namespace(", "NestedArg(", "Traceback")
NO_GPU = "--trainer.accelerator=gpu"

#: (recipe, overrides, key, value): ``fedlit fit --config <recipe> <tiny run> <overrides>``.
#: The run directory is ``{work}/run``; ``{work}`` is the (snapshotted) working folder, which
#: holds ``afile``, a regular file.
FIT = [
    # data
    ("server_sl", ["--data.num_clients=0"], "data.num_clients", "0"),
    ("server_sl", ["--data.num_clients=-2"], "data.num_clients", "-2"),
    ("server_sl", ["--data.num_clients=two"], "data.num_clients", "two"),
    ("server_sl", ["--data.num_clients=1.5"], "data.num_clients", "1.5"),
    ("server_sl", ["--data.examples_per_client=0"], "data.examples_per_client", "0"),
    ("server_sl", ["--data.labeled_per_class=-1"], "data.labeled_per_class", "-1"),
    ("server_sl", ["--data.labeled_per_class=7000"], "data.labeled_per_class", "7000"),
    ("server_sl", ["--data.labeled_fraction=1.5"], "data.labeled_fraction", "1.5"),
    ("server_sl", ["--data.val_per_class=-1"], "data.val_per_class", "-1"),
    ("server_sl", ["--data.batch_size=0"], "data.batch_size", "0"),
    ("server_sl", ["--data.client_batch_size=0"], "data.client_batch_size", "0"),
    ("server_sl", ["--data.eval_batch_size=-5"], "data.eval_batch_size", "-5"),
    ("server_sl", ["--data.test_subset=0"], "data.test_subset", "0"),
    ("server_sl", ["--data.stream_steps=0"], "data.stream_steps", "0"),
    ("server_sl", ["--data.dataset=imagenet"], "data.dataset", "imagenet"),
    ("server_sl", ["--data.labels_at=nowhere"], "data.labels_at", "nowhere"),
    ("server_sl", ["--data.client_pool=nowhere"], "data.client_pool", "nowhere"),
    ("server_sl", ["--data.server_unlabeled_fraction=2"], "data.server_unlabeled_fraction", "2"),
    ("server_sl", ["--data.download=maybe"], "data.download", "maybe"),
    ("server_sl", ["--data.root={work}/afile", "--data.download=false"], "data.root", "afile"),
    ("server_sl", ["--data.nope=1"], "data.nope", "1"),
    ("server_sl", ["--data.partitioner=NoSuchPartitioner"], "data.partitioner", "NoSuch"),
    ("server_sl", ["--data.partitioner=fedlit.methods.ServerSL"], "data.partitioner", "ServerSL"),
    ("server_sl", ["--data.partitioner=Dirichlet", "--data.partitioner.alpha=0"], "alpha", "0"),
    ("server_sl", ["--data.partitioner=Dirichlet", "--data.partitioner.alpha=-1"], "alpha", "-1"),
    ("server_sl", ["--data.partitioner=Dirichlet", "--data.partitioner.alpha=x"], "alpha", "x"),
    ("server_sl", ["--data.partitioner=ClassesPerClient", "--data.partitioner.n=0"], ".n", "0"),
    ("server_sl", ["--data.partitioner=SSFL", "--data.partitioner.r=2"], "partitioner", "2"),
    ("server_sl", ["--data.partitioner=IID", "--data.partitioner.beta=1"], "beta", "1"),
    # model
    ("server_sl", ["--model=NoSuchMethod"], "model", "NoSuchMethod"),
    ("server_sl", ["--model.class_path=fedlit.data.IID"], "model", "fedlit.data.IID"),
    ("server_sl", ["--model.init_args.backbone=vgg99"], "model.init_args.backbone", "vgg99"),
    ("server_sl", ["--model.init_args.norm=xx"], "model.init_args.norm", "xx"),
    ("server_sl", ["--model.init_args.nope=1"], "model.init_args.nope", "1"),
    ("fedrgd", ["--model.init_args.num_groups=0"], "model.init_args.num_groups", "0"),
    ("fedrgd", ["--model.init_args.num_groups=5"], "model.init_args.num_groups", "5"),
    ("fedcon", ["--model.init_args.ema_decay=1.5"], "model.init_args.ema_decay", "1.5"),
    ("fedcon", ["--model.init_args.client_ema_decay=-1"], "model.init_args.client_ema_decay", "-1"),
    (
        "fedseal",
        ["--model.init_args.bootstrap_epochs=-1"],
        "model.init_args.bootstrap_epochs",
        "-1",
    ),
    ("fedsup", ["--model.init_args.lambda_s=0"], "model.init_args.lambda_s", "0"),
    ("fedsup", ["--model.init_args.lambda_s=2"], "model.init_args.lambda_s", "2"),
    ("fedswitch", ["--model.init_args.beta=-1"], "model.init_args.beta", "-1"),
    ("ts_server_ema", ["--model.init_args.ema_decay=2"], "model.init_args.ema_decay", "2"),
    ("fedavg_simclr", ["--model.init_args.temperature=0"], "model.init_args.temperature", "0"),
    ("fedavg_simclr", ["--model.init_args.proj_dim=0"], "model.init_args.proj_dim", "0"),
    ("fedavg_byol", ["--model.init_args.byol_momentum=2"], "model.init_args.byol_momentum", "2"),
    ("fedmatch", ["--model.init_args.num_helpers=-1"], "model.init_args.num_helpers", "-1"),
    ("fedmatch", ["--model.init_args.helper_interval=0"], "model.init_args.helper_interval", "0"),
    ("fedmatch", ["--model.init_args.lambda_s=-1"], "model.init_args.lambda_s", "-1"),
    ("fedmatch", ["--model.init_args.psi_factor=-1"], "model.init_args.psi_factor", "-1"),
    # optim
    ("server_sl", ["--model.init_args.optim.server_lr=0"], "model.init_args.optim.server_lr", "0"),
    (
        "server_sl",
        ["--model.init_args.optim.server_lr=-1"],
        "model.init_args.optim.server_lr",
        "-1",
    ),
    ("server_sl", ["--model.init_args.optim.server_lr=.nan"], "optim.server_lr", "nan"),
    ("server_sl", ["--model.init_args.optim.server_lr=.inf"], "optim.server_lr", "inf"),
    ("server_sl", ["--model.init_args.optim.server_lr=fast"], "optim.server_lr", "fast"),
    ("fedavg_fixmatch", ["--model.init_args.optim.client_lr=0"], "optim.client_lr", "0"),
    ("server_sl", ["--model.init_args.optim.momentum=-1"], "model.init_args.optim.momentum", "-1"),
    (
        "server_sl",
        ["--model.init_args.optim.momentum=1.5"],
        "model.init_args.optim.momentum",
        "1.5",
    ),
    ("server_sl", ["--model.init_args.optim.weight_decay=-1"], "optim.weight_decay", "-1"),
    ("server_sl", ["--model.init_args.optim.optimizer=rmsprop"], "optim.optimizer", "rmsprop"),
    ("server_sl", ["--model.init_args.optim.lr_decay=0"], "optim.lr_decay", "0"),
    ("server_sl", ["--model.init_args.optim.lr_decay=2"], "optim.lr_decay", "2"),
    ("server_sl", ["--model.init_args.optim.lr_schedule=zigzag"], "optim.lr_schedule", "zigzag"),
    ("server_sl", ["--model.init_args.optim.warmup=1.5"], "model.init_args.optim.warmup", "1.5"),
    ("server_sl", ["--model.init_args.optim.cosine_c=-1"], "optim.cosine_c", "-1"),
    ("server_sl", ["--model.init_args.optim.nope=3"], "model.init_args.optim.nope", "3"),
    # loss
    ("fedavg_fixmatch", ["--model.init_args.loss.tau=1.5"], "model.init_args.loss.tau", "1.5"),
    ("fedavg_fixmatch", ["--model.init_args.loss.tau=-0.1"], "model.init_args.loss.tau", "-0.1"),
    ("fedprox_fixmatch", ["--model.init_args.loss.mu=-1"], "model.init_args.loss.mu", "-1"),
    ("ts_server_ema", ["--model.init_args.loss.lambda_u=-1"], "loss.lambda_u", "-1"),
    ("fedseal", ["--model.init_args.loss.theta=1"], "model.init_args.loss.theta", "1"),
    ("fedseal", ["--model.init_args.loss.lambda_max=0"], "model.init_args.loss.lambda_max", "0"),
    ("fedseal", ["--model.init_args.loss.ramp=2"], "model.init_args.loss.ramp", "2"),
    ("fedmatch", ["--model.init_args.loss.tau=2"], "model.init_args.loss.tau", "2"),
    ("fedmatch", ["--model.init_args.loss.lambda_l2=-1"], "model.init_args.loss.lambda_l2", "-1"),
    ("fedavg_uda", ["--model.init_args.loss.threshold=2"], "model.init_args.loss.threshold", "2"),
    ("fedavg_uda", ["--model.init_args.loss.temperature=0"], "loss.temperature", "0"),
    ("fedavg_fixmatch", ["--model.init_args.loss.nope=1"], "model.init_args.loss.nope", "1"),
    # settings of the previous schema: named, with their new place
    ("fedavg_fixmatch", ["--model.init_args.client_lr=0.1"], "optim.client_lr", "0.1"),
    ("fedavg_fixmatch", ["--model.init_args.server_lr=0.1"], "optim.server_lr", "0.1"),
    ("server_sl", ["--model.init_args.momentum=0.5"], "optim.momentum", "0.5"),
    ("server_sl", ["--model.init_args.lr_schedule=cosine"], "optim.lr_schedule", "cosine"),
    ("fedavg_fixmatch", ["--model.init_args.tau=0.9"], "loss.tau", "0.9"),
    ("fedprox_fixmatch", ["--model.init_args.mu=0.1"], "loss.mu", "0.1"),
    ("fedseal", ["--model.init_args.theta=0.1"], "loss.theta", "0.1"),
    ("ts_server_ema", ["--model.init_args.lambda_u=2"], "loss.lambda_u", "2"),
    # federation
    ("server_sl", ["--federation.rounds=0"], "federation.rounds", "0"),
    ("server_sl", ["--federation.rounds=-1"], "federation.rounds", "-1"),
    ("server_sl", ["--federation.rounds=many"], "federation.rounds", "many"),
    ("fedavg_sl", ["--federation.clients_per_round=0"], "federation.clients_per_round", "0"),
    ("fedavg_sl", ["--federation.clients_per_round=3"], "federation.clients_per_round", "3"),
    ("server_sl", ["--federation.local_epochs=0"], "federation.local_epochs", "0"),
    ("server_sl", ["--federation.local_steps=0"], "federation.local_steps", "0"),
    ("server_sl", ["--federation.server_epochs=0"], "federation.server_epochs", "0"),
    ("server_sl", ["--federation.eval_every=0"], "federation.eval_every", "0"),
    ("server_sl", ["--federation.min_clients=0"], "federation.min_clients", "0"),
    ("fedavg_sl", ["--federation.min_clients=3"], "federation.min_clients", "3"),
    ("server_sl", ["--federation.eval_epochs=0"], "federation.eval_epochs", "0"),
    ("server_sl", ["--federation.eval_lr=0"], "federation.eval_lr", "0"),
    ("server_sl", ["--federation.eval_lr=.inf"], "federation.eval_lr", "inf"),
    ("server_sl", ["--federation.final_eval=[nope]"], "federation.final_eval", "nope"),
    ("server_sl", ["--federation.executor=spark"], "federation.executor", "spark"),
    ("server_sl", ["--federation.resume="], "federation.resume", "''"),
    ("server_sl", ["--federation.resume={work}/none.ckpt"], "federation.resume", "none.ckpt"),
    ("server_sl", ["--federation.resume={work}/afile"], "federation.resume", "afile"),
    ("server_sl", ["--federation.resume_may_change=[nope.key]"], "resume_may_change", "nope.key"),
    ("server_sl", ["--federation.nope=1"], "federation.nope", "1"),
    ("server_sl", ["--federation.init_from="], "federation.init_from", "''"),
    ("server_sl", ["--federation.init_from={work}/none"], "federation.init_from", "none"),
    ("server_sl", ["--federation.init_from={work}/afile"], "federation.init_from", "afile"),
    ("server_sl", ["--federation.init_from={work}"], "federation.init_from", "holds no"),
    ("server_sl", ["--federation.init_from={run}", "--model.init_args.norm=gn"], "init_from", "gn"),
    (
        "server_sl",
        ["--federation.init_from={run}", "--data.dataset=synthetic_rgb"],
        "federation.init_from",
        "in_channels",
    ),
    # ray (settings of the configuration; the cluster's resources are checked when it starts)
    ("server_sl", ["--federation.ray.cpus=-1"], "federation.ray.cpus", "-1"),
    ("server_sl", ["--federation.ray.cpus=0"], "federation.ray.cpus", "0"),
    ("server_sl", ["--federation.ray.gpus=-1"], "federation.ray.gpus", "-1"),
    ("server_sl", ["--federation.ray.workers=0"], "federation.ray.workers", "0"),
    ("server_sl", ["--federation.ray.max_retries=-1"], "federation.ray.max_retries", "-1"),
    ("server_sl", ["--federation.ray.cpus=many"], "federation.ray.cpus", "many"),
    ("server_sl", ["--federation.ray.nope=1"], "federation.ray.nope", "1"),
    # trainer
    ("server_sl", ["--trainer.default_root_dir="], "trainer.default_root_dir", "''"),
    ("server_sl", ["--trainer.default_root_dir=/proc/fedlit-run"], "default_root_dir", "/proc"),
    ("server_sl", ["--trainer.default_root_dir={work}/afile/run"], "default_root_dir", "afile"),
    ("server_sl", ["--trainer.default_root_dir={work}/afile"], "default_root_dir", "afile"),
    ("server_sl", ["--trainer.limit_train_batches=0"], "trainer.limit_train_batches", "0"),
    ("server_sl", ["--trainer.limit_train_batches=-1"], "trainer.limit_train_batches", "-1"),
    ("server_sl", ["--trainer.limit_train_batches=1.5"], "trainer.limit_train_batches", "1.5"),
    ("server_sl", ["--trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val", "-1"),
    ("server_sl", ["--trainer.gradient_clip_val=.nan"], "trainer.gradient_clip_val", "nan"),
    ("server_sl", ["--trainer.gradient_clip_algorithm=foo"], "gradient_clip_algorithm", "foo"),
    ("server_sl", ["--trainer.accumulate_grad_batches=0"], "accumulate_grad_batches", "0"),
    ("server_sl", ["--trainer.accelerator=tpu"], "trainer.accelerator", "tpu"),
    ("server_sl", [NO_GPU], "trainer.accelerator", "gpu"),
    ("server_sl", ["--trainer.devices=0"], "trainer.devices", "0"),
    ("server_sl", ["--trainer.precision=13"], "trainer.precision", "13"),
    ("server_sl", ["--trainer.strategy=nope"], "trainer.strategy", "nope"),
    ("server_sl", ["--trainer.deterministic=maybe"], "trainer.deterministic", "maybe"),
    ("server_sl", ["--trainer.max_epochs=3"], "trainer.max_epochs", "3"),
    ("server_sl", ["--trainer.fast_dev_run=true"], "trainer.fast_dev_run", "true"),
    ("server_sl", ["--trainer.callbacks=[]"], "trainer.callbacks", "[]"),
    ("server_sl", ["--trainer.nope=1"], "trainer.nope", "1"),
    # seed
    ("server_sl", ["--seed_everything=-1"], "seed_everything", "-1"),
    ("server_sl", ["--seed_everything=4294967296"], "seed_everything", "4294967296"),
    ("server_sl", ["--seed_everything=abc"], "seed_everything", "abc"),
    # the command line itself
    ("server_sl", ["--nope=1"], "nope", "1"),
]

#: (arguments after ``fedlit compare --name=x --recipes=[server_sl.yaml]``, key, value)
COMPARE = [
    (["--seeds=[-1]"], "seeds", "-1"),
    (["--seeds=[0, 4294967296]"], "seeds", "4294967296"),
    (["--seeds=[0, 0]"], "seeds", "[0, 0]"),
    (["--seeds=[]"], "seeds", "[]"),
    (["--recipes=[]"], "recipes", ""),
    (["--recipes=[{work}/missing.yaml]"], "recipes", "missing.yaml"),
    (["--out={run}"], "out", "{run}"),
    (["--out={run}/checkpoints/compare"], "out", "compare"),
    (["--out={work}/afile"], "out", "afile"),
    (["--out={work}/afile/compare"], "out", "afile"),
    (["--report={work}/afile/report.md"], "report", "report.md"),
    (["--report={run}/report.md"], "report", "report.md"),
    (["--jobs=0"], "jobs", "0"),
    (["--jobs=abc"], "jobs", "abc"),
    (["--last_k=0"], "last_k", "0"),
    (["--target=2"], "target", "2"),
    (["--baseline=nope"], "baseline", "nope"),
    (["--settings={}"], "settings", ""),
    (["--nope=1"], "nope", "1"),
]

#: (arguments after ``fedlit report {run}``, key, value)
REPORT = [
    (["--out={run}"], "--out", "{run}"),
    (["--out={run}/checkpoints"], "--out", "checkpoints"),
    (["--out={work}/afile"], "--out", "afile"),
    (["--out={work}/afile/report"], "--out", "afile"),
    (["--out="], "--out", "''"),
    (["--last_k=0"], "last_k", "0"),
    (["--last_k=abc"], "last_k", "abc"),
    (["--baseline=nope"], "baseline", "nope"),
    (["{work}/no-such-run"], "no-such-run", ""),
]

#: (arguments after ``fedlit partition --config server_sl.yaml <tiny run>``, key, value)
PARTITION = [
    (["--out", "{run}/partition.png"], "--out", "partition.png"),
    (["--out", "{work}/afile/partition.png"], "--out", "afile"),
    (["--out={work}/afile/sub/partition.png"], "--out", "afile"),
    (["--out={work}"], "--out", "a folder"),
    (["--out="], "--out='': empty", ""),
    (["--data.num_clients=0"], "data.num_clients", "0"),
    (["--data.partitioner=Dirichlet", "--data.partitioner.alpha=-1"], "alpha", "-1"),
    (["--seed_everything=-1"], "seed_everything", "-1"),
]


def _snapshot(*folders: Path) -> dict[Path, bytes | None]:
    """Every path under ``folders``: a file's bytes, None for a folder."""
    return {
        p: (p.read_bytes() if p.is_file() else None)
        for folder in folders
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def finished(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-round run: what ``report`` reads and what no output may land in."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    main(
        [
            "fit",
            f"--config={RECIPES / 'server_sl.yaml'}",
            *tiny_overrides(fmnist_root),
            "--federation.final_eval=[]",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    return run_dir


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working folder (also the current directory), holding a regular file ``afile``."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "afile").write_text("not a folder\n")
    monkeypatch.chdir(folder)
    return folder


def _filled(items: list[str], work: Path, run: Path) -> list[str]:
    return [s.replace("{work}", str(work)).replace("{run}", str(run)) for s in items]


def _refused_by_name(
    argv: list[str],
    key: str,
    value: str,
    capsys: pytest.CaptureFixture[str],
    watched: tuple[Path, ...],
) -> None:
    before = _snapshot(*watched)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    assert key in lines[0], lines[0]
    assert value in lines[0], lines[0]
    for dump in DUMPS:
        assert dump not in err, err
    assert _snapshot(*watched) == before


def _case_id(case: tuple[object, ...]) -> str:
    *_, key, value = case
    return f"{key}={value}"


@pytest.mark.parametrize(("recipe", "args", "key", "value"), FIT, ids=map(_case_id, FIT))
def test_fit_refuses_by_name_before_any_work(
    recipe: str,
    args: list[str],
    key: str,
    value: str,
    fmnist_root: Path,
    finished: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if args == [NO_GPU] and _has_cuda():
        pytest.skip("this machine has a GPU")
    argv = [
        "fit",
        f"--config={RECIPES / f'{recipe}.yaml'}",
        *tiny_overrides(fmnist_root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={work / 'run'}",
        *_filled(args, work, finished),
    ]
    _refused_by_name(argv, key, value, capsys, (work, finished))


@pytest.mark.parametrize(("args", "key", "value"), COMPARE, ids=map(_case_id, COMPARE))
def test_compare_refuses_by_name_before_any_work(
    args: list[str],
    key: str,
    value: str,
    finished: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "compare",
        "--name=x",
        f"--recipes=[{RECIPES / 'server_sl.yaml'}]",
        f"--out={work / 'compare'}",
        *_filled(args, work, finished),
    ]
    key, value = _filled([key, value], work, finished)
    _refused_by_name(argv, key, value, capsys, (work, finished))


@pytest.mark.parametrize(("args", "key", "value"), REPORT, ids=map(_case_id, REPORT))
def test_report_refuses_by_name_before_any_work(
    args: list[str],
    key: str,
    value: str,
    finished: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["report", str(finished), f"--out={work / 'report'}", *_filled(args, work, finished)]
    key, value = _filled([key, value], work, finished)
    _refused_by_name(argv, key, value, capsys, (work, finished))


@pytest.mark.parametrize(("args", "key", "value"), PARTITION, ids=map(_case_id, PARTITION))
def test_partition_refuses_by_name_before_any_work(
    args: list[str],
    key: str,
    value: str,
    fmnist_root: Path,
    finished: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    filled = _filled(args, work, finished)
    out = [] if any(a.startswith("--out") for a in filled) else ["--out", str(work / "p.png")]
    argv = [
        "partition",
        f"--config={RECIPES / 'server_sl.yaml'}",
        *tiny_overrides(fmnist_root),
        *out,
        *filled,
    ]
    _refused_by_name(argv, key, value, capsys, (work, finished))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


PROCESSES = [
    (
        ["fit", "--config=recipes/fedavg_fixmatch.yaml", "--model.init_args.tau=0.9"],
        "model.init_args.tau=0.9: no such setting of FedAvgFixMatch; "
        "it moved to model.init_args.loss.tau",
    ),
    (
        ["compare", "--name=x", "--recipes=[recipes/server_sl.yaml]", "--seeds=[-1]"],
        "seeds: -1 is not a seed (an integer in [0, 4294967295])",
    ),
]


@pytest.mark.parametrize(("args", "line"), PROCESSES, ids=lambda a: str(a)[:40])
def test_console_script_prints_the_refusal_alone(
    args: list[str], line: str, tmp_path: Path
) -> None:
    """As a real process: status 2, and stderr is the refusal's one line."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlit", *args]
        + ([f"--trainer.default_root_dir={run_dir}"] if args[0] == "fit" else []),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [s for s in proc.stderr.splitlines() if s.startswith("error: ")]
    assert errors == [f"error: {line}"], proc.stderr
    assert not any(d in proc.stderr for d in DUMPS)
    assert not run_dir.exists()
    assert sorted(tmp_path.iterdir()) == []


def test_the_table_covers_every_group_of_settings() -> None:
    keys = " ".join(key for *_, key, _ in FIT)
    for group in ("data.", "model.", "optim.", "loss.", "federation.", "ray.", "trainer."):
        assert group in keys, group
    assert COMPARE and REPORT and PARTITION


def test_a_run_directory_is_a_folder_holding_what_a_run_writes(tmp_path: Path) -> None:
    """Output is refused inside a run, not inside any folder holding a ``config.yaml``."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("anyone: 1\n")
    assert enclosing_run(project / "report") is None
    assert output_dir_error(project / "report", "--out") is None
    (project / "hparams.yaml").write_text("")  # the two files a run writes first
    assert enclosing_run(project / "report" / "deeper") == project.resolve()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    error = output_dir_error(run / "checkpoints", "out")
    assert error is not None and f"inside the run directory {run.resolve()}" in error


def test_trainer_values_with_a_meaning_are_accepted() -> None:
    """``gradient_clip_val`` 0 is Lightning's "no clipping"; a fraction of 1.0 is every batch."""
    accepted = TrainerTemplate(
        accelerator="cpu", gradient_clip_val=0, limit_train_batches=1.0, accumulate_grad_batches=1
    )
    accepted.check()
    assert accepted.build().gradient_clip_val == 0
    with pytest.raises(ValueError, match=r"^trainer\.gradient_clip_val=-0\.5: must be >= 0"):
        TrainerTemplate(accelerator="cpu", gradient_clip_val=-0.5).check()


def test_a_short_key_is_written_in_full_only_where_one_setting_fits() -> None:
    keys = ["model.init_args.loss.tau", "model.init_args.optim.momentum", "data.root"]
    assert with_full_key("tau must be in [0, 1], got 2", keys) == (
        "model.init_args.loss.tau must be in [0, 1], got 2"
    )
    assert with_full_key("optim.momentum must be in [0, 1)", keys).startswith(
        "model.init_args.optim.momentum must"
    )
    two = [*keys, "model.init_args.teacher.tau"]
    assert with_full_key("tau must be in [0, 1]", two) == "tau must be in [0, 1]"
    assert with_full_key("data.root: missing", keys) == "data.root: missing"


def test_a_recipe_of_the_previous_schema_is_told_where_its_settings_went(
    fmnist_root: Path, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recipe written before ``optim`` and ``loss`` grouped the method's settings."""
    old = work / "old.yaml"
    old.write_text(
        "model:\n"
        "  class_path: fedlit.methods.FedAvgFixMatch\n"
        "  init_args:\n"
        "    backbone: small_cnn\n"
        "    client_lr: 0.003\n"
    )
    argv = ["fit", f"--config={old}", *tiny_overrides(fmnist_root)]
    argv.append(f"--trainer.default_root_dir={work / 'run'}")
    key = "model.init_args.client_lr=0.003"
    _refused_by_name(argv, key, "it moved to model.init_args.optim.client_lr", capsys, (work,))
