"""The hostile-input table: bad values of every group of settings (data, model, optim, loss,
federation, ray, trainer, seed, compare, report, partition), each refused before any work with
exit status 2 and one ``error:`` line naming the key (and the value where there is one), without
jsonargparse's Union/Namespace dump, and nothing under the run's parent (the working folder)
or in an existing run changed. The CLI runs in-process; a few cases as real processes."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import lock_held_by_another_process, tiny_overrides

from fedlit.cli import main
from fedlit.federation import TrainerTemplate
from fedlit.federation.checks import check_trainer
from fedlit.refusals import with_full_key
from fedlit.run_layout import enclosing_run, write_path_error

REPO = Path(__file__).parents[1]
RECIPES = REPO / "recipes"
DUMPS = ("Union subtypes", "Namespace(", "NestedArg(", "Traceback")
NO_GPU = "--trainer.accelerator=gpu"
#: A name over NAME_MAX (255 bytes), and a path over PATH_MAX (4096 bytes) of names within it.
LONG_NAME = "n" * 300
LONG_PATH = "/".join(["d" * 200] * 23)
#: Files of the working folder: YAML a parser would read wrongly (a key given twice keeps the
#: last; a group that is not a mapping was dropped).
YAMLS = {
    "twice.yaml": "federation:\n  rounds: 2\n  rounds: 3\n",
    "two_models.yaml": (
        "model:\n  class_path: fedlit.methods.ServerSL\n"
        "model:\n  class_path: fedlit.methods.FedAvgFixMatch\n"
    ),
    "trainer_list.yaml": "trainer: [1, 2]\n",
    "pool_number.yaml": "federation:\n  pool: 3\n",
    "compare_twice.yaml": "seeds: [0]\nseeds: [1]\n",
    "compare_settings_list.yaml": "settings: [iid, noniid]\n",
}

#: (recipe, overrides, key, value): ``fedlit fit --config <recipe> <tiny run> <overrides>``.
#: The run directory is ``{work}/run``; ``{work}`` is the (snapshotted) working folder, which
#: holds ``afile``, a regular file, ``loop``, a symlink to itself, ``dangling``, a symlink to
#: nothing, and the :data:`YAMLS`; ``{run}`` is a finished run.
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
    (
        "server_sl",
        ["--model.init_args.network.backbone=vgg99"],
        "model.init_args.network.backbone",
        "vgg99",
    ),
    ("server_sl", ["--model.init_args.network.norm=xx"], "model.init_args.network.norm", "xx"),
    ("server_sl", ["--model.init_args.nope=1"], "model.init_args.nope", "1"),
    # model vs data: a backbone that does not fit the data's images, linked keys contradicting
    (
        "server_sl",
        ["--model.init_args.network.backbone=fedcon_cifar_cnn"],
        "backbone",
        "fedcon_cifar",
    ),
    (
        "server_sl",
        ["--data.dataset=synthetic", "--model.init_args.network.backbone=fedcon_cifar_cnn"],
        "model.init_args.network.backbone",
        "1x28x28",
    ),
    (
        "server_sl",
        ["--data.dataset=synthetic_rgb", "--model.init_args.network.backbone=fedcon_mnist_cnn"],
        "model.init_args.network.backbone",
        "3x32x32",
    ),
    (
        "server_sl",
        ["--model.init_args.network.backbone=custom_backbones.FlatNet"],
        "backbone",
        "FlatNet",
    ),
    (
        "server_sl",
        ["--model.init_args.network.num_classes=100"],
        "model.init_args.network.num_classes",
        "100",
    ),
    (
        "server_sl",
        ["--model.init_args.network.in_channels=3"],
        "model.init_args.network.in_channels",
        "3",
    ),
    (
        "server_sl",
        ["--model.init_args.network.image_size=32"],
        "model.init_args.network.image_size",
        "32",
    ),
    # the method's groups of settings given as a list (an AttributeError's traceback before)
    ("server_sl", ["--model.init_args.network=[1, 2]"], "model.init_args.network", "not a list"),
    ("server_sl", ["--model.init_args.optim=[1, 2]"], "model.init_args.optim", "not a list"),
    ("fedavg_fixmatch", ["--model.init_args.loss=[1, 2]"], "model.init_args.loss", "not a list"),
    # any backbone: names, class paths, weights
    ("server_sl", ["--model.init_args.network.backbone=torchvision/nonet"], "backbone", "nonet"),
    ("server_sl", ["--model.init_args.network.backbone=custom_backbones.Nope"], "backbone", "Nope"),
    ("server_sl", ["--model.init_args.network.backbone=no_such_module.Net"], "backbone", "no_such"),
    (
        "server_sl",
        [
            "--model.init_args.network.backbone=torchvision/squeezenet1_0",
            "--model.init_args.network.norm=gn",
        ],
        "model.init_args.network.norm",
        "gn",
    ),
    (
        "fedsup",
        ["--model.init_args.network.backbone=torchvision/squeezenet1_0"],
        "backbone",
        "squeeze",
    ),
    (
        "server_sl",
        ["--model.init_args.network.backbone_weights={work}/none.pt"],
        "weights",
        "none.pt",
    ),
    ("server_sl", ["--model.init_args.network.backbone_weights={work}/afile"], "weights", "afile"),
    (
        "server_sl",
        ["--model.init_args.network.backbone_weights={work}"],
        "backbone_weights",
        "folder",
    ),
    ("server_sl", ["--model.init_args.network.backbone_weights=download"], "weights", "download"),
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
    (
        "server_sl",
        ["--federation.init_from={run}", "--model.init_args.network.norm=gn"],
        "init_from",
        "gn",
    ),
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
    ("server_sl", ["--trainer.default_root_dir=/sys/fedlit-run"], "default_root_dir", "/sys"),
    ("server_sl", ["--trainer.default_root_dir={work}/loop"], "default_root_dir", "symlink loop"),
    ("server_sl", ["--trainer.default_root_dir={work}/loop/run"], "default_root_dir", "loop"),
    ("server_sl", ["--trainer.default_root_dir={work}/dangling/run"], "dangling", "not exist"),
    ("server_sl", [f"--trainer.default_root_dir={{work}}/{LONG_NAME}"], "root_dir", "NAME_MAX"),
    ("server_sl", [f"--trainer.default_root_dir={{work}}/{LONG_PATH}"], "root_dir", "PATH_MAX"),
    ("server_sl", ["--trainer.default_root_dir={run}/checkpoints"], "root_dir", "inside the run"),
    ("server_sl", ["--trainer.default_root_dir={run}/fork"], "root_dir", "inside the run"),
    ("server_sl", ["--trainer.devices=2"], "trainer.devices", "federation.executor pool"),
    # config files
    ("server_sl", ["--config={work}/twice.yaml"], "federation.rounds is given twice", "line 3"),
    ("server_sl", ["--config={work}/two_models.yaml"], "model is given twice", "line 3"),
    ("server_sl", ["--config={work}/trainer_list.yaml"], "trainer=[1, 2]", "not a list"),
    ("server_sl", ["--config={work}/pool_number.yaml"], "federation.pool=3", "not an int"),
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
    (["--out={work}/loop"], "out", "symlink loop"),
    (["--out={work}/loop/compare"], "out", "symlink loop"),
    (["--out=/proc/fedlit-compare"], "out", "/proc"),
    ([f"--out={{work}}/{LONG_NAME}"], "out", "NAME_MAX"),
    ([f"--out={{work}}/{LONG_PATH}"], "out", "PATH_MAX"),
    (["--report={run}"], "report", "is a folder"),
    (["--report={work}"], "report", "is a folder"),
    (["--report=/proc/report.md"], "report", "/proc"),
    (["--report={work}/loop/report.md"], "report", "symlink loop"),
    ([f"--settings={{{LONG_NAME}: []}}"], "settings.nnn", "NAME_MAX"),
    (["--config={work}/compare_twice.yaml"], "seeds is given twice", "line 2"),
    (["--config={work}/compare_settings_list.yaml"], "settings=", "not a list"),
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
    (["--out={work}/loop"], "--out", "symlink loop"),
    (["--out={work}/loop/report"], "--out", "symlink loop"),
    (["--out={work}/dangling/report"], "--out", "not exist"),
    (["--out=/proc/fedlit-report"], "--out", "/proc"),
    (["--out=/dev/fedlit-report"], "--out", "/dev"),
    ([f"--out={{work}}/{LONG_NAME}"], "--out", "NAME_MAX"),
    ([f"--out={{work}}/{LONG_PATH}"], "--out", "PATH_MAX"),
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
    (["--out={work}/loop/p.png"], "--out", "symlink loop"),
    (["--out=/proc/p.png"], "--out", "/proc"),
    ([f"--out={{work}}/{LONG_NAME}.png"], "--out", "NAME_MAX"),
    (["--out={run}/checkpoints/p.png"], "--out", "inside the run directory"),
    (["--config={work}/twice.yaml"], "federation.rounds is given twice", "line 3"),
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
    """The working folder (also the current directory), holding a regular file ``afile``,
    the symlinks ``loop`` (to itself) and ``dangling`` (to nothing) and the :data:`YAMLS`."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "afile").write_text("not a folder\n")
    (folder / "loop").symlink_to("loop")
    (folder / "dangling").symlink_to("nowhere")
    for name, text in YAMLS.items():
        (folder / name).write_text(text)
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


@pytest.mark.parametrize(
    "args",
    [
        ["--federation.executor=ray"],
        ["--federation.executor=ray", "--federation.ray.address=nowhere:1"],
        ["--federation.executor=ray", "--federation.ray.workers=2", "--federation.ray.gpus=1"],
    ],
    ids=["plain", "address", "workers-gpus"],
)
def test_ray_without_ray_installed_is_refused_naming_the_extra(
    args: list[str],
    fmnist_root: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quick-start's install has no Ray: the executor is refused before any work, naming
    the extra to install, whatever other Ray settings are given (a ModuleNotFoundError's
    traceback before)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    argv = [
        "fit",
        f"--config={RECIPES / 'fedavg_fixmatch.yaml'}",
        *tiny_overrides(fmnist_root),
        f"--trainer.default_root_dir={work / 'run'}",
        *args,
    ]
    _refused_by_name(argv, "federation.executor", "fedlit[ray]", capsys, (work,))


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
    assert write_path_error(project / "report", "--out") is None
    (project / "hparams.yaml").write_text("")  # the two files a run writes first
    assert enclosing_run(project / "report" / "deeper") == project.resolve()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    error = write_path_error(run / "checkpoints", "out")
    assert error is not None and f"inside the run directory {run.resolve()}" in error


def test_trainer_values_with_a_meaning_are_accepted() -> None:
    """``gradient_clip_val`` 0 is Lightning's "no clipping"; a fraction of 1.0 is every batch."""
    accepted = TrainerTemplate(
        accelerator="cpu", gradient_clip_val=0, limit_train_batches=1.0, accumulate_grad_batches=1
    )
    check_trainer(accepted)
    assert accepted.loop().gradient_clip_val == 0
    with pytest.raises(ValueError, match=r"^trainer\.gradient_clip_val=-0\.5: must be >= 0"):
        check_trainer(TrainerTemplate(accelerator="cpu", gradient_clip_val=-0.5))


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
        "model:\n  class_path: fedlit.methods.FedAvgFixMatch\n  init_args:\n    client_lr: 0.003\n"
    )
    argv = ["fit", f"--config={old}", *tiny_overrides(fmnist_root)]
    argv.append(f"--trainer.default_root_dir={work / 'run'}")
    key = "model.init_args.client_lr=0.003"
    _refused_by_name(argv, key, "it moved to model.init_args.optim.client_lr", capsys, (work,))


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("    norm: gn\n", "model.init_args.norm='gn'"),
        ("    backbone: {class_path: custom_backbones.TinyNet}\n", "model.init_args.backbone"),
    ],
)
def test_a_recipe_written_before_the_network_group_is_told_where_its_settings_went(
    setting: str, key: str, fmnist_root: Path, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The network's settings moved into ``model.init_args.network``: a recipe that gives
    one (a plain value, or a class with its own settings) at the old place is refused,
    naming the new one."""
    old = work / "old.yaml"
    old.write_text("model:\n  class_path: fedlit.methods.ServerSL\n  init_args:\n" + setting)
    argv = ["fit", f"--config={old}", *tiny_overrides(fmnist_root)]
    argv.append(f"--trainer.default_root_dir={work / 'run'}")
    new = key.split("=")[0].replace("init_args.", "init_args.network.")
    _refused_by_name(argv, key, f"no such setting of ServerSL; it moved to {new}", capsys, (work,))


def _fit_argv(fmnist_root: Path, run_dir: Path, *args: str, rounds: int = 1) -> list[str]:
    return [
        "fit",
        f"--config={RECIPES / 'server_sl.yaml'}",
        *tiny_overrides(fmnist_root, rounds=rounds),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={run_dir}",
        *args,
    ]


def test_a_compiler_that_does_not_run_is_refused_before_the_run_directory(
    fmnist_root: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CXX=/nonexistent/g++``: inductor's compiler is set but broken, and ``g++`` on the PATH
    does not make it work; refused naming the setting and the compiler, nothing written."""
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("CXX", "/nonexistent/g++")
    argv = _fit_argv(fmnist_root, work / "run", "--federation.compile=default")
    # torch's own patch: monkeypatch's undo would delete the setting from inductor's config,
    # failing every later compile in this process
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        _refused_by_name(argv, "federation.compile='default'", "/nonexistent/g++", capsys, (work,))
    assert inductor_config.cpp.cxx[-1] != "/nonexistent/g++"
    assert not (work / "run").exists()


@pytest.fixture(scope="module")
def finished_two_rounds(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``finished``'s recipe and seed, run for two rounds instead of one."""
    run_dir = tmp_path_factory.mktemp("finished2") / "run"
    main(_fit_argv(fmnist_root, run_dir, rounds=2))
    return run_dir


def test_report_gives_two_runs_of_one_seed_that_differ_rows_of_their_own(
    finished: Path, finished_two_rounds: Path, work: Path
) -> None:
    """Two seed-0 runs of one method differing in ``federation.rounds`` are two rows, each
    labelled by its value and giving the rounds it ran: not one seed counted twice."""
    main(["report", str(finished), str(finished_two_rounds), f"--out={work / 'report'}"])
    with (work / "report" / "results.csv").open(newline="") as f:
        rows = {row["rounds"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"1", "2"}
    assert "federation.rounds=1" in rows["1"]["setting"]
    assert "federation.rounds=2" in rows["2"]["setting"]
    assert rows["1"]["seeds"] == rows["2"]["seeds"] == "0"


def test_report_warns_of_a_last_k_above_the_rounds(
    finished_two_rounds: Path, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warning naming --last_k and the run; the report is written (over both rounds)."""
    capsys.readouterr()
    main(["report", str(finished_two_rounds), "--last_k=100", f"--out={work / 'report'}"])
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, err
    assert "--last_k=100 exceeds the 2 round(s)" in warnings[0]
    assert str(finished_two_rounds) in warnings[0]
    assert (work / "report" / "results.md").is_file()


def test_settings_of_another_executor_and_too_many_threads_are_warned_of() -> None:
    from fedlit.cli import executor_warnings

    assert executor_warnings({"executor": "ray", "ray": {"cpus": 2.0}}, cores=2) == []
    assert executor_warnings({"executor": "pool", "pool": {"threads": 2}}, cores=2) == []
    (ray,) = executor_warnings({"executor": "pool", "ray": {"cpus": 4.0, "gpus": 0.0}}, cores=2)
    assert ray.startswith("federation.ray.cpus=4.0: not used, federation.executor is 'pool'")
    (pool,) = executor_warnings({"executor": "local", "pool": {"workers": 4}}, cores=2)
    assert pool.startswith("federation.pool.workers=4: not used")
    (threads,) = executor_warnings({"executor": "pool", "pool": {"threads": 64}}, cores=2)
    assert threads.startswith("federation.pool.threads=64 exceeds the 2 CPU core(s)")
    (workers,) = executor_warnings({"executor": "pool", "pool": {"workers": 64}}, cores=2)
    assert workers.startswith("federation.pool.workers=64 exceeds the 2 CPU core(s)")
    both = executor_warnings({"executor": "pool", "pool": {"workers": 64, "threads": 64}}, 2)
    assert len(both) == 2


def test_a_fit_with_ray_settings_and_a_local_executor_warns_and_runs(
    fmnist_root: Path, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    main(_fit_argv(fmnist_root, work / "run", "--federation.ray.cpus=2"))
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: federation.ray.cpus=2.0: not used, federation.executor is 'local' "
        "(these settings are the ray executor's)"
    ], err
    assert (work / "run" / "checkpoints" / "last.ckpt").is_file()


def test_a_key_given_twice_is_found_at_any_depth() -> None:
    from fedlit.refusals import duplicate_key

    assert duplicate_key("a: 1\nb:\n  c: 1\n  c: 2\n") == ("b.c", 4, 3)
    assert duplicate_key("model: {x: 1}\nmodel: {y: 2}\n") == ("model", 2, 1)
    assert duplicate_key("s:\n  - {e: 1, e: 2}\n") == ("s[0].e", 2, 2)
    assert duplicate_key("a: &x {b: 1}\nc: *x\n1: 2\n'1': 3\n") is None  # int 1, str '1'
    assert duplicate_key("a: [1\n") is None  # a syntax error: the loader's to report


# --- a data set of the user's files -----------------------------------------------------------
def _user_files(folder: Path) -> None:
    """Under ``folder``: ``images/`` (train/c<k>/, test/c<k>/ of generated PNGs),
    ``clients/`` (labeled/c<k>/, clients/{a,b}/, test/c<k>/) and ``arrays.npz``."""
    import numpy as np
    from torchvision.io import write_png

    from fedlit.data.datasets import synthetic_images

    def write(split: Path, n: int, seed: int) -> None:
        images, labels = synthetic_images(n, seed, 10, 1, 28)
        for k, (image, label) in enumerate(zip(images, labels, strict=True)):
            (split / f"c{int(label)}").mkdir(parents=True, exist_ok=True)
            write_png(image, str(split / f"c{int(label)}" / f"{k:04d}.png"))

    write(folder / "images" / "train", 200, 0)
    write(folder / "images" / "test", 20, 1)
    write(folder / "clients" / "labeled", 100, 0)
    write(folder / "clients" / "test", 20, 1)
    pool, _ = synthetic_images(50, 2, 10, 1, 28)
    for name, part in (("a", pool[:20]), ("b", pool[20:])):
        (folder / "clients" / "clients" / name).mkdir(parents=True)
        for k, image in enumerate(part):
            write_png(image, str(folder / "clients" / "clients" / name / f"{k:04d}.png"))
    x, y = synthetic_images(200, 0, 10, 1, 28)
    xt, yt = synthetic_images(20, 1, 10, 1, 28)
    np.savez(folder / "arrays.npz", x_train=x[:, 0], y_train=y, x_test=xt[:, 0], y_test=yt)


def _rewrite_arrays(work: Path, **changes: object) -> None:
    """``arrays.npz`` with ``changes`` (None: that key left out)."""
    import numpy as np

    with np.load(work / "arrays.npz") as saved:
        arrays = {k: saved[k] for k in saved.files} | changes
    np.savez(work / "arrays.npz", **{k: v for k, v in arrays.items() if v is not None})


def _huge_header(work: Path) -> None:
    """``arrays.npz`` whose ``x_train`` header claims 10^12 bytes (its data is 10 bytes)."""
    import io
    import zipfile

    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        member, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 1000, 1000)}
    )
    member.write(bytes(10))
    with np.load(work / "arrays.npz") as saved:
        others = {k: saved[k] for k in saved.files if k != "x_train"}
    with zipfile.ZipFile(work / "arrays.npz", "w") as npz:
        npz.writestr("x_train.npy", member.getvalue())
        for key, value in others.items():
            buffer = io.BytesIO()
            np.save(buffer, value)
            npz.writestr(f"{key}.npy", buffer.getvalue())


class _Code:
    """Pickles as a call (print): what ``torch.load(weights_only=True)`` must refuse to run."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("code from a data file ran",))


def _pickle_with_code(work: Path) -> None:
    import pickle

    with open(work / "arrays.pt", "wb") as f:
        pickle.dump({"x_train": _Code()}, f)


def _bad_png(work: Path, name: str, size: int) -> None:
    import torch
    from torchvision.io import write_png

    write_png(torch.zeros(1, size, size, dtype=torch.uint8), str(work / name))


def _linked(folder: Path, target: str) -> None:
    """``folder`` replaced by a symbolic link to ``target`` (relative to its parent)."""
    shutil.rmtree(folder)
    folder.symlink_to(target)


#: How a test spoils the user's files (``_user_files``) under the working folder.
SPOIL = {
    "": lambda w: None,
    "no test split": lambda w: shutil.rmtree(w / "images" / "test"),
    "empty class": lambda w: [p.unlink() for p in (w / "images/train/c3").iterdir()],
    "link loop": lambda w: (w / "images/train/c6/loop").symlink_to("."),
    # a folder reached twice through a link: two classes, two clients, the test split and the
    # training split, a client and a labeled class (each read twice, without a word, before)
    "two classes one folder": lambda w: _linked(w / "images/train/c1", "c0"),
    "test is train": lambda w: _linked(w / "images/test", "train"),
    "two clients one folder": lambda w: _linked(w / "clients/clients/b", "a"),
    "a client is a class": lambda w: _linked(w / "clients/clients/b", "../labeled/c0"),
    "one class": lambda w: [
        shutil.rmtree(p) for p in (w / "images/train").iterdir() if p.name != "c0"
    ],
    "broken image": lambda w: (w / "images/train/c0/broken.png").write_bytes(b"\x89PNG nope"),
    "other size": lambda w: _bad_png(w, "images/train/c1/big.png", 30),
    "label 12": lambda w: _rewrite_arrays(w, y_test=np.array([12] * 20)),
    "no y_test": lambda w: _rewrite_arrays(w, y_test=None),
    "float images": lambda w: _rewrite_arrays(w, x_train=np.zeros((200, 28, 28))),
    "empty x_test": lambda w: _rewrite_arrays(
        w, x_test=np.zeros((0, 28, 28), np.uint8), y_test=np.zeros(0, np.int64)
    ),
    "string labels": lambda w: _rewrite_arrays(w, y_train=np.array(["shoe"] * 200)),
    "huge header": _huge_header,
    "pickled code": _pickle_with_code,
}

IMAGES = ["--data.dataset=folder", "--data.path={work}/images"]
CLIENTS = ["--data.dataset=client_folders", "--data.path={work}/clients"]
CLIENTS += ["--data.examples_per_client=null"]
ARRAYS = ["--data.dataset=arrays", "--data.path={work}/arrays.npz"]

#: (recipe, spoiling, overrides, key, value): ``fedlit fit --config <recipe> <tiny run>
#: <overrides>`` on the user's files under ``{work}``, spoiled by ``SPOIL[spoiling]``.
USER_DATA = [
    ("server_sl", "no test split", IMAGES, "images/test", "missing"),
    ("server_sl", "empty class", IMAGES, "images/train/c3", "empty class folder"),
    ("server_sl", "link loop", IMAGES, "c6/loop", "read twice"),
    ("server_sl", "two classes one folder", IMAGES, "images/train/c1 is", "images/train/c0 again"),
    ("server_sl", "test is train", IMAGES, "images/test/c0 is", "images/train/c0 again"),
    ("server_sl", "two clients one folder", CLIENTS, "clients/clients/b is", "clients/a again"),
    ("server_sl", "a client is a class", CLIENTS, "clients/clients/b is", "labeled/c0 again"),
    ("server_sl", "one class", IMAGES, "images/train", "one class folder ('c0')"),
    ("server_sl", "broken image", IMAGES, "c0/broken.png", "not a readable image"),
    ("server_sl", "other size", IMAGES, "data.image_size", "big.png is 30x30"),
    ("server_sl", "", [*IMAGES, "--data.image_size=0"], "data.image_size", "0"),
    ("server_sl", "", [*IMAGES, "--data.image_size=100000"], "data.image_size", "100000"),
    ("server_sl", "", ["--data.dataset=folder"], "data.path", "folder"),
    ("server_sl", "", ["--data.path={work}/images"], "data.path", "images"),
    ("server_sl", "", [IMAGES[0], "--data.path={work}/nowhere"], "data.path", "nowhere"),
    ("server_sl", "label 12", ARRAYS, "y_test", "label 12"),
    ("server_sl", "no y_test", ARRAYS, "arrays.npz", "y_test"),
    ("server_sl", "float images", ARRAYS, "x_train", "uint8"),
    ("server_sl", "empty x_test", ARRAYS, "x_test", "holds no images"),
    ("server_sl", "string labels", ARRAYS, "y_train", "labels must be integers"),
    ("server_sl", "huge header", ARRAYS, "arrays.npz", "larger than this machine's memory"),
    (
        "server_sl",
        "pickled code",
        ["--data.dataset=arrays", "--data.path={work}/arrays.pt"],
        "arrays.pt",
        "cannot be read as arrays",
    ),
    ("fedavg_sl", "", CLIENTS, "data.dataset='client_folders'", "FedAvgSL is an oracle"),
    ("server_sl", "", [*CLIENTS, "--data.labels_at=client"], "data.labels_at", "client_folders"),
    ("server_sl", "", [*CLIENTS, "--data.labeled_per_class=9999"], "class 0", "of client_folders"),
    ("server_sl", "", [*IMAGES, "--data.examples_per_client=9999"], "9999 x", "exceeds the"),
    ("server_sl", "", [*CLIENTS, "--data.partitioner=RandomProportions"], "partitioner", "folders"),
    (
        "server_sl",
        "",
        ["--data.dataset={class_path: torchvision.datasets.FakeData}"],
        "data.test_dataset",
        "FakeData",
    ),
]


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user_files")
    _user_files(folder)
    return folder


@pytest.mark.parametrize(
    ("recipe", "spoiling", "args", "key", "value"), USER_DATA, ids=map(_case_id, USER_DATA)
)
def test_fit_refuses_the_users_files_by_name_before_any_work(
    recipe: str,
    spoiling: str,
    args: list[str],
    key: str,
    value: str,
    user_files: Path,
    fmnist_root: Path,
    finished: Path,
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nothing is written, not even the statistics cache into the user's folder."""
    shutil.copytree(user_files, work, dirs_exist_ok=True)
    SPOIL[spoiling](work)
    argv = [
        "fit",
        f"--config={RECIPES / f'{recipe}.yaml'}",
        *tiny_overrides(fmnist_root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={work / 'run'}",
        *_filled(args, work, finished),
    ]
    _refused_by_name(argv, key, value, capsys, (work, finished))


#: A user's Dataset (tests/custom_datasets.py) as data.dataset, its test split a good one.
DATASET_ARGS = [
    "--data.path=null",
    "--data.image_size=null",
    "--data.num_clients=2",
    "--data.labeled_per_class=1",
    "--data.val_per_class=0",
    "--data.examples_per_client=null",
]


@pytest.mark.parametrize(
    ("dataset", "line"),
    [
        (
            "custom_datasets.RaisesOnItem",
            "data.dataset[3]: RaisesOnItem.__getitem__(3) raised KeyError",
        ),
        ("custom_datasets.RaisesOnLen", "data.dataset: RaisesOnLen.__len__ raised RuntimeError"),
    ],
)
def test_a_users_dataset_that_raises_is_named_with_the_item_before_its_traceback(
    dataset: str, line: str, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's own code failing: one line naming the setting and the item, then the
    user's exception with its traceback (exit 1, not a setting refused); nothing written."""
    argv = [
        "fit",
        f"--config={RECIPES / 'examples' / 'image_folder.yaml'}",
        f"--data.dataset={{class_path: {dataset}}}",
        "--data.test_dataset={class_path: custom_datasets.RaisesOnItem}",
        *DATASET_ARGS,
        f"--trainer.default_root_dir={work / 'run'}",
    ]
    before = _snapshot(work)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 1, err
    first, error = err.splitlines()[:2]  # what fit does, said before its imports; the error
    assert first.startswith("fedlit fit: training a federation from"), err
    assert error == f"fedlit: error: {line}; its traceback:", err
    assert "Traceback" in err and "custom_datasets.py" in err  # the user's own frames
    assert _snapshot(work) == before


def test_a_users_float_image_with_a_nan_pixel_is_refused_by_item(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "fit",
        f"--config={RECIPES / 'examples' / 'image_folder.yaml'}",
        "--data.dataset={class_path: custom_datasets.NanPixel}",
        "--data.test_dataset={class_path: custom_datasets.NanPixel}",
        *DATASET_ARGS,
        f"--trainer.default_root_dir={work / 'run'}",
    ]
    _refused_by_name(argv, "data.dataset[5]", "NaN", capsys, (work,))


def test_a_statistics_file_holding_nan_is_measured_again(tmp_path: Path) -> None:
    """A damaged cache under the right fingerprint (NaN, an infinity, a negative deviation)
    is not used: the statistics are measured again and the file written right."""
    import json

    from fedlit.data.own.statistics import StatisticsCache

    cache = StatisticsCache(tmp_path / "fedlit-stats.json", "key")
    for mean, std in (([float("nan")], [0.2]), ([0.5], [float("inf")]), ([0.5], [-0.1])):
        cache.path.write_text(json.dumps({"fingerprint": "key", "mean": mean, "std": std}))
        assert cache.read() is None
    cache.write([0.5], [0.2])
    assert cache.read() == ((0.5,), (0.2,))


def test_an_animated_gif_is_read_as_its_first_frame(tmp_path: Path) -> None:
    """A class folder may hold GIFs; an animated one is read as its first frame (as PIL and
    image viewers show it), not refused and not a traceback."""
    from PIL import Image

    from fedlit.data.own.decode import read_image

    frames = [Image.new("L", (9, 7), color=c) for c in (10, 200, 90)]
    frames[0].save(tmp_path / "moving.gif", save_all=True, append_images=frames[1:])
    image = read_image(tmp_path / "moving.gif")
    assert image.ndim == 3 and image.shape[-2:] == (7, 9)  # (C, H, W): one frame
    assert image.dtype == torch.uint8 and int(image.float().mean()) == 10  # the first


def test_a_warm_start_from_a_run_still_being_written_is_refused(
    fmnist_root: Path, finished: Path, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``federation.init_from`` a run directory whose lock a live process holds: its last
    checkpoint changes as that run goes on, so the warm start would depend on when it was
    read; refused by name (a checkpoint file named directly is taken as it is)."""
    argv = [
        "fit",
        f"--config={RECIPES / 'server_sl.yaml'}",
        *tiny_overrides(fmnist_root),
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={work / 'run'}",
        f"--federation.init_from={finished}",
    ]
    with lock_held_by_another_process(finished / ".lock"):
        _refused_by_name(argv, "federation.init_from", "still being written", capsys, (work,))


def test_a_users_class_whose_constructor_raises_is_named_with_its_error(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Dataset given by class path whose ``__init__`` raises: one line naming the class and
    what it raised ("Expected a <class 'str'>; ..." before)."""
    argv = [
        "fit",
        f"--config={RECIPES / 'examples' / 'image_folder.yaml'}",
        "--data.dataset={class_path: custom_datasets.RaisesOnInit}",
        "--data.test_dataset={class_path: custom_datasets.RaisesOnItem}",
        *DATASET_ARGS,
        f"--trainer.default_root_dir={work / 'run'}",
    ]
    _refused_by_name(
        argv, "RaisesOnInit(...) raised in its constructor", "nowhere/index.csv", capsys, (work,)
    )


def test_a_constant_channel_is_divided_by_one_so_its_views_stay_bounded(tmp_path: Path) -> None:
    """Decided: a channel spread over less than one grey level (every pixel the same here) is
    divided by 1, not by its deviation (it was clamped to 1e-6: the plain view 0, but the
    strong view, whose RandAugment moves the pixels, reached 3 x 10^5): every view within
    [-1, 1], nothing refused."""
    from fedlit.data.augment import batch_view
    from fedlit.data.own.arrays import read_arrays

    x = np.full((40, 8, 8), 77, np.uint8)
    np.savez(
        tmp_path / "flat.npz",
        x_train=x,
        y_train=np.arange(40) % 2,
        x_test=x[:4],
        y_test=np.arange(4) % 2,
    )
    spec, _ = read_arrays(tmp_path / "flat.npz", None)
    assert spec.std == (1.0,)
    for view in ("plain", "weak", "strong"):
        views = batch_view(view, spec)(torch.from_numpy(x[:8, None]))
        assert views.abs().max() <= 1.0, view


def test_no_process_of_a_pool_run_outlives_its_driver_but_the_resource_tracker(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """Decided: the pool's workers are killed and reaped before the driver exits; the only
    process of the run's group that may outlive it is multiprocessing's resource tracker
    (spawn's helper), which ends by itself within seconds once the driver's end closes its
    pipe."""
    import time

    import psutil

    argv = [
        sys.executable, "-m", "fedlit", "fit", f"--config={RECIPES / 'fedavg_fixmatch.yaml'}",
        *tiny_overrides(fmnist_root), "--federation.final_eval=[]",
        "--federation.executor=pool", "--federation.pool.workers=2",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)

    def group() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == driver.pid and proc.pid != driver.pid:
                    found.append(proc)
            except (ProcessLookupError, psutil.Error):
                pass
        return found

    assert driver.wait(timeout=300) == 0
    left = [" ".join(p.cmdline()) for p in group() if p.status() != psutil.STATUS_ZOMBIE]
    assert all("resource_tracker" in cmd for cmd in left), left
    deadline = time.monotonic() + 10
    while group() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group()
