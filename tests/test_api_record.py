"""A run made through the Python API records the settings it ran in ``hparams.yaml``, in the
flat dotted form ``fedlit fit`` records, read from the objects it was given: reports list the
settings that differ between API and CLI runs, and a resume compares them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import tiny_data, tiny_overrides
from torch import nn
from torch.utils.data import TensorDataset

from fedlit.cli import main
from fedlit.data import Dirichlet, FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.methods import FedAvgFixMatch, ServerSL
from fedlit.models import Architecture
from fedlit.objectives import FixMatchLoss, Optimization

REPO = Path(__file__).parents[1]


def _hparams(run_dir: Path) -> dict[str, Any]:
    data = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _cli_run(root: Path, run_dir: Path) -> None:
    """``fedlit fit`` of recipes/fedavg_fixmatch.yaml, shrunk (:func:`conftest.tiny_overrides`)."""
    recipe = str(REPO / "recipes" / "fedavg_fixmatch.yaml")
    where = f"--trainer.default_root_dir={run_dir}"
    main(["fit", f"--config={recipe}", *tiny_overrides(root), where])


def test_an_api_run_records_what_it_ran(fmnist_root: Path, tmp_path: Path) -> None:
    """Its epochs, learning rates, loss, seed, data and partitioner, under the CLI's keys."""
    method = FedAvgFixMatch(
        Architecture(10, 1),
        optim=Optimization(server_lr=0.02, client_lr=0.05),
        loss=FixMatchLoss(tau=0.8),
    )
    data = tiny_data(fmnist_root, partitioner=Dirichlet(alpha=0.5), labeled_per_class=7)
    config = FederationConfig(rounds=1, clients_per_round=2, server_epochs=3, final_eval=["linear"])
    Federation(method, data, config, tmp_path / "api", seed=7).run()
    got = _hparams(tmp_path / "api")
    assert got["seed_everything"] == 7
    assert got["federation.server_epochs"] == 3 and got["federation.rounds"] == 1
    assert got["federation.final_eval"] == "('linear',)"  # as the CLI writes a tuple
    assert got["model.class_path"] == "fedlit.methods.FedAvgFixMatch"
    assert got["model.init_args.optim.server_lr"] == 0.02
    assert got["model.init_args.optim.client_lr"] == 0.05
    assert got["model.init_args.loss.tau"] == 0.8
    assert got["model.init_args.network.backbone"] == "small_cnn"
    assert got["model.init_args.network.num_classes"] is None  # the data's own, as the CLI's
    assert got["data.dataset"] == "fashion_mnist" and got["data.labeled_per_class"] == 7
    assert got["data.num_clients"] == 2 and got["data.examples_per_client"] == 32
    assert got["data.partitioner.class_path"] == "fedlit.data.Dirichlet"
    assert got["data.partitioner.init_args.alpha"] == 0.5
    assert got["trainer.default_root_dir"] == str(tmp_path / "api")
    assert got["trainer.logger"] is False


def test_an_api_run_records_what_the_cli_records_for_the_same_run(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """recipes/fedavg_fixmatch.yaml, shrunk, run by ``fedlit fit`` and built by hand: the
    same keys and values, but for where each writes and what the recipe spells otherwise
    (``trainer.devices``: the CLI's default ``auto``, the API's 1; the partitioner's path
    as the recipe writes it)."""
    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    _cli_run(fmnist_root, cli_dir)
    method = FedAvgFixMatch(
        Architecture(10, 1, backbone="small_cnn"),
        optim=Optimization(server_lr=0.03, client_lr=0.03),
        loss=FixMatchLoss(tau=0.9, mu=0.0),
    )
    config = FederationConfig(rounds=1, clients_per_round=2, local_epochs=1, server_epochs=1)
    Federation(method, tiny_data(fmnist_root), config, api_dir, seed=0).run()
    cli, api = _hparams(cli_dir), _hparams(api_dir)
    assert list(cli) == list(api)
    differ = {key for key in cli if cli[key] != api[key]}
    assert differ == {
        "trainer.devices",
        "trainer.default_root_dir",
        "data.partitioner.class_path",
    }
    assert api["data.partitioner.class_path"] == "fedlit.data.IID"
    assert cli["data.partitioner.class_path"] == "fedlit.data.partition.IID"


@pytest.mark.parametrize(
    "recipe",
    [
        "centralized_fixmatch.yaml",  # keyword-only arguments
        "fedseal.yaml",
        "fedmatch.yaml",
        "papers/fedcon_cifar10_noniid.yaml",  # a partitioner's arguments, labeled_fraction
        "papers/fedavg_fixmatch_stl10.yaml",  # the data set's default client pool
    ],
)
def test_recipes_built_by_hand_record_what_the_cli_records(recipe: str) -> None:
    """The objects ``fedlit fit`` builds from a recipe, given to a Federation without its
    flat config: the record read from them is the CLI's, key for key and in order, but for
    the partitioner's path, which the recipes spell by its module."""
    from fedlit.cli.fit import federation_of
    from fedlit.resolver import resolve

    cli = resolve(["--config", str(REPO / "recipes" / recipe), "--data.num_clients=2"])
    mine, theirs = federation_of(cli).hparams, cli.flat_config()
    assert list(mine) == list(theirs)
    differ = {key for key in theirs if mine[key] != theirs[key]}
    assert differ <= {"data.partitioner.class_path"}


def test_a_report_lists_what_differs_between_an_api_run_and_a_cli_run(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """``fedlit report`` over a Server-SL run of the Python API (server learning rate 0.05, 3
    server epochs) and a CLI run of FedAvg-FixMatch (0.03, 1): the learning rate is in
    "Settings that differ" with both values; the epochs, a budget setting, are in the budget
    table and its flag, where the report shows the server's budget."""
    config = FederationConfig(rounds=1, clients_per_round=2, server_epochs=3)
    method = ServerSL(Architecture(10, 1), optim=Optimization(server_lr=0.05))
    Federation(method, tiny_data(fmnist_root), config, tmp_path / "api").run()
    cli_dir = tmp_path / "cli"
    _cli_run(fmnist_root, cli_dir)
    out = tmp_path / "report"
    main(["report", str(tmp_path / "api"), str(cli_dir), f"--out={out}"])
    text = (out / "results.md").read_text()
    table = text[text.index("### Settings that differ") :]
    rows = {row.split(" | ")[0]: row for row in table.splitlines() if row.startswith("| `")}
    assert rows["| `model.init_args.optim.server_lr`"].endswith("| `0.03` | `0.05` |")
    # what both ran alike is not listed: the data, the federation, the data's network
    assert not [key for key in rows if "data." in key or "federation." in key or "network" in key]
    assert "| ServerSL | 3 (1 x 3) | 3 |" in text
    assert "server budget: 3 epochs vs 2 epochs" in text


def test_resuming_an_api_run_with_a_changed_setting_is_refused(
    fmnist_root: Path, tmp_path: Path
) -> None:
    """As a CLI resume is: the changed setting named, nothing run; with its own settings
    (one more round, which a resume may change) it continues."""
    run_dir = tmp_path / "api"
    first = FederationConfig(rounds=1, clients_per_round=2, server_epochs=1)
    Federation(ServerSL(Architecture(10, 1)), tiny_data(fmnist_root), first, run_dir).run()
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    changed = FederationConfig(rounds=2, clients_per_round=2, server_epochs=2, resume=ckpt)
    federation = Federation(ServerSL(Architecture(10, 1)), tiny_data(fmnist_root), changed, run_dir)
    with pytest.raises(ValueError, match=r"federation\.server_epochs=2 \(the checkpoint's: 1\)"):
        federation.prepare()
    method = ServerSL(Architecture(10, 1), optim=Optimization(server_lr=0.1))
    again = FederationConfig(rounds=2, clients_per_round=2, resume=ckpt)
    other = Federation(method, tiny_data(fmnist_root), again, run_dir)
    with pytest.raises(ValueError, match=r"model\.init_args\.optim\.server_lr=0\.1"):
        other.prepare()
    same = FederationConfig(rounds=2, clients_per_round=2, server_epochs=1, resume=ckpt)
    result = Federation(ServerSL(Architecture(10, 1)), tiny_data(fmnist_root), same, run_dir).run()
    assert [row["round"] for row in result.history] == [1.0, 2.0]


def test_a_class_spelt_two_ways_is_one_setting(tmp_path: Path) -> None:
    """A recipe's ``fedlit.data.partition.IID`` and the ``fedlit.data.IID`` a Python-API run
    (or a resolved short name) records are one partitioner: the two seeds share a row."""
    from test_reporting import synthetic_rows, write_run

    from fedlit.reporting import find_runs, summarize
    from fedlit.reporting.groups import one_class

    assert one_class(["fedlit.data.partition.IID", "fedlit.data.IID"])
    assert not one_class(["fedlit.data.partition.IID", "fedlit.data.Dirichlet"])
    assert not one_class(["os.path.Path", "fedlit.data.IID"])  # only fedlit's are imported
    assert not one_class(["fedlit.data.IID", 3]) and not one_class(["fedlit.data.IID"])
    for seed, path in enumerate(("fedlit.data.partition.IID", "fedlit.data.IID")):
        run = write_run(tmp_path / f"s{seed}", synthetic_rows("FedSEAL", [0.5, 0.6]), seed=seed)
        flat = {"seed_everything": seed, "data.partitioner.class_path": path}
        (run / "hparams.yaml").write_text(yaml.safe_dump(flat))
    (row,) = summarize(find_runs([tmp_path]))
    assert row.seeds == (0, 1)


class _Port:
    """An object whose argument is a property that raises when read."""

    def __init__(self, port: int) -> None:
        self._port = port

    @property
    def port(self) -> int:
        raise RuntimeError("not connected")


class _Own(ServerSL):
    """A user's method with an argument the record can read (``scale``) and two it cannot
    (a module that keeps no attribute per argument, an object whose argument raises)."""

    def __init__(
        self, network: Architecture, head: nn.Module, port: _Port, scale: float = 2.0
    ) -> None:
        super().__init__(network)
        self.head, self.link, self.scale = head, port, scale


@pytest.mark.filterwarnings("ignore:Attribute 'head' is an instance of `nn.Module`")
def test_what_cannot_be_known_is_left_out(tmp_path: Path) -> None:
    """A torch Dataset (``data.dataset``, ``data.test_dataset``), a module built from
    ``*args`` and an object whose argument cannot be read have no value a config can hold:
    their keys are left out, not invented; the settings beside them are recorded."""
    images, labels = torch.zeros(40, 1, 8, 8), torch.arange(40) % 2
    data = FederatedDataModule(
        TensorDataset(images, labels),
        test_dataset=TensorDataset(images[:10], labels[:10]),
        num_clients=2,
        labeled_per_class=5,
    )
    method = _Own(Architecture(2, 1), nn.Sequential(nn.Linear(4, 2)), _Port(80), scale=3.0)
    got = Federation(method, data, FederationConfig(rounds=1), tmp_path / "run").hparams
    assert got["model.init_args.scale"] == 3.0
    assert not [
        key for key in got if key.startswith(("model.init_args.head", "model.init_args.port"))
    ]
    assert "data.dataset" not in got and "data.test_dataset" not in got
    assert got["data.num_clients"] == 2 and got["data.labeled_per_class"] == 5
    assert got["model.class_path"].endswith("test_api_record._Own")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"run_dir": ""}, "run_dir='': empty; name the run's directory"),
        ({"seed": -1}, "seed=-1: a seed is an integer in [0, 4294967295]"),
        ({"seed": "zero"}, "seed='zero': a seed is an integer"),
        ({"method": "fedavg"}, "method='fedavg': give a fedlit method"),
        ({"loggers": [42]}, "loggers[0]=42: not a Lightning logger"),
    ],
    ids=["run_dir", "seed-1", "seed-zero", "method", "loggers"],
)
def test_the_api_refuses_bad_arguments_by_name_before_writing(
    given: dict[str, Any],
    named: str,
    fmnist_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Federation(...)`` names the argument as ``fedlit fit`` names its key, and writes
    nothing (``run_dir=""`` once wrote the run into the current directory)."""
    monkeypatch.chdir(tmp_path)
    arguments: dict[str, Any] = {
        "method": ServerSL(Architecture(10, 1)),
        "data": tiny_data(fmnist_root),
        "config": FederationConfig(rounds=1),
        "run_dir": tmp_path / "run",
    }
    with pytest.raises(ValueError) as err:
        Federation(**(arguments | given)).run()
    assert named in str(err.value)
    assert list(tmp_path.iterdir()) == []
