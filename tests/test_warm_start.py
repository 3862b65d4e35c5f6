"""Warm starts (``federation.init_from``): a run starts from another run's scored network.

The hand-checkable case: a warm-started run, evaluated before its first round on the same
split, scores exactly what its source scored last (the same network, the same test images).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import stop_in_round, tiny_overrides

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.federation.warmstart import load_warm_start, weights_sha256
from fedlit.methods import (
    CentralizedFixMatch,
    CentralizedUDA,
    FedAvgBYOL,
    FedAvgFixMatch,
    FedAvgSimCLR,
    FedAvgSimSiam,
    FedAvgSL,
    FedAvgUDA,
    FedCon,
    FederatedMethod,
    FedMatch,
    FedRGD,
    FedSEAL,
    FedSup,
    FedSwitch,
    SemiFL,
    ServerSL,
    TSClientEMA,
    TSServerEMA,
)
from fedlit.models import Architecture
from fedlit.objectives import FixMatchLoss
from fedlit.reporting import load_run

REPO = Path(__file__).parents[1]
DATA = {"num_clients": 2, "examples_per_client": 32, "client_batch_size": 16,
        "labeled_per_class": 5, "val_per_class": 2, "test_subset": 200}  # fmt: skip
EVERY_METHOD = [
    ServerSL, FedAvgSL, FedAvgFixMatch, FedAvgUDA, FedAvgSimCLR, FedAvgSimSiam, FedAvgBYOL,
    FedCon, FedSup, FedRGD, FedSEAL, FedSwitch, TSServerEMA, TSClientEMA, FedMatch,
    CentralizedFixMatch, CentralizedUDA, SemiFL,
]  # fmt: skip


def _federation(
    root: Path,
    run_dir: Path,
    method: FederatedMethod,
    seed: int = 0,
    **config: object,
) -> Federation:
    data = FederatedDataModule(root=str(root), **DATA)  # type: ignore[arg-type]
    cfg = FederationConfig(**{"rounds": 1, "clients_per_round": 2, **config})  # type: ignore[arg-type]
    return Federation(method, data, cfg, run_dir=run_dir, seed=seed, progress=False)


@pytest.fixture(scope="module")
def source(fmnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-round Server-SL run (seed 0): the run others start from."""
    run_dir = tmp_path_factory.mktemp("source") / "server_sl"
    _federation(
        fmnist_root, run_dir, ServerSL(Architecture(10, 1)), rounds=2, server_epochs=2
    ).run()
    return run_dir


def _spec(name: str) -> dict[str, Any]:
    """The comparison spec ``recipes/comparisons/<name>.yaml``, as its YAML reads."""
    return yaml.safe_load((REPO / f"recipes/comparisons/{name}.yaml").read_text())


def _source_acc(run_dir: Path) -> float:
    return load_run(run_dir).history[-1]["test/acc"]


@pytest.mark.parametrize("method_cls", EVERY_METHOD, ids=lambda c: c.__name__)
def test_a_warm_start_scores_its_source_before_its_first_round(
    method_cls: type[FederatedMethod], fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    """Every method's scored network is the source's before any round: its evaluation equals
    the source's last test/acc (FedMatch's theta = sigma + psi: to rounding of its split)."""
    fed = _federation(
        fmnist_root, tmp_path / "warm", method_cls(Architecture(10, 1)), init_from=str(source)
    )
    fed.prepare()
    try:
        assert fed.server.evaluate()["test/acc"] == _source_acc(source)
        want = fed.source.network if fed.source is not None else {}
        got = dict(fed.method.eval_network().named_parameters())  # FedSEAL's BN statistics
        for key, value in want.items():  # are re-estimated as the scored ones, its w^0's
            if key in got:
                assert torch.allclose(got[key], value, atol=1e-6), key
    finally:
        fed.close()
    assert not (tmp_path / "warm").exists()  # prepare writes nothing


def test_each_method_seeds_its_other_networks(
    fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    """The teacher, FedCon's target, FedSup's online network: the source's network too; an SSL
    method's projector keeps its initial draw; FedSEAL's thresholds are measured on it."""
    state = load_warm_start(source, ServerSL(Architecture(10, 1))).network

    def warm(method: FederatedMethod, name: str) -> FederatedMethod:
        fed = _federation(fmnist_root, tmp_path / name, method, init_from=str(source))
        fed.prepare()
        fed.close()
        return fed.method

    def same(module: torch.nn.Module) -> bool:
        got = module.state_dict()
        return all(torch.equal(got[k], v) for k, v in state.items())

    ts = warm(TSServerEMA(Architecture(10, 1)), "ts")
    assert isinstance(ts, TSServerEMA) and same(ts.teacher) and int(ts.teacher_steps) == 0
    con = warm(FedCon(Architecture(10, 1)), "con")
    assert isinstance(con, FedCon) and same(con.target) and same(con.network)
    sup = warm(FedSup(Architecture(10, 1)), "sup")
    assert isinstance(sup, FedSup) and same(sup.server_network) and same(sup.network)
    torch.manual_seed(0)
    simclr = warm(FedAvgSimCLR(Architecture(10, 1)), "simclr")
    fresh = FedAvgSimCLR(Architecture(10, 1))
    fresh_fed = _federation(fmnist_root, tmp_path / "fresh", fresh)
    fresh_fed.prepare()
    fresh_fed.close()
    assert simclr.network.projector is not None and fresh.network.projector is not None
    for key, value in fresh.network.projector.state_dict().items():  # the seed's own draw
        assert torch.equal(simclr.network.projector.state_dict()[key], value)
    seal = warm(FedSEAL(Architecture(10, 1)), "seal")
    assert isinstance(seal, FedSEAL) and (seal.thresholds < 1).any()  # measured, not the 1s
    match = warm(FedMatch(Architecture(10, 1)), "match")
    assert isinstance(match, FedMatch) and (match.psi != 0).any()


def test_a_warm_run_records_its_source_and_skips_the_bootstrap(
    fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    """``fedlit fit --federation.init_from``: row 0's warm_start_test/acc is the source's
    score; run.json names the source's checkpoint and the SHA-256 of its weights; config.yaml
    holds init_from; FedSEAL's bootstrap does not run."""
    run_dir = tmp_path / "warm"
    main(
        [
            "fit",
            f"--config={REPO / 'recipes' / 'fedseal.yaml'}",
            *tiny_overrides(fmnist_root, test_subset=200),
            "--data.examples_per_client=32",
            f"--federation.init_from={source}",
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    record = load_run(run_dir)
    assert record.summary["warm_start_test/acc"] == _source_acc(source)
    assert not any(key.startswith("bootstrap") for key in record.summary)
    info = json.loads((run_dir / "run.json").read_text())["init_from"]
    ckpt = RunCheckpoint.load(source / "checkpoints" / "last.ckpt")
    state = ckpt.method_state
    want = {k[len("network.") :]: v for k, v in state.items() if k.startswith("network.")}
    assert info["path"] == str((source / "checkpoints" / "last.ckpt").resolve())
    assert info["sha256"] == weights_sha256(want) and len(info["sha256"]) == 64
    assert info["method"] == "ServerSL" and info["round"] == 2
    assert info["test_acc"] == _source_acc(source)
    assert record.init_from == info
    assert str(source) in (run_dir / "config.yaml").read_text()


def test_a_warm_run_resumes_without_reading_its_source_again(
    fmnist_root: Path, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after round 1 and resumed, a warm run ends with the uninterrupted run's weights,
    though its source's checkpoint is gone by then (the resume never reloads it)."""
    copy = tmp_path / "source"
    (copy / "checkpoints").mkdir(parents=True)
    (copy / "checkpoints" / "last.ckpt").write_bytes(
        (source / "checkpoints" / "last.ckpt").read_bytes()
    )
    kw = {"init_from": str(copy), "rounds": 2}

    def method() -> FederatedMethod:
        return FedAvgFixMatch(Architecture(10, 1), loss=FixMatchLoss(tau=0.5))

    full = _federation(fmnist_root, tmp_path / "full", method(), **kw)
    full.run()
    cut_dir = tmp_path / "cut"
    undo = stop_in_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _federation(fmnist_root, cut_dir, method(), **kw).run()
    undo()
    (copy / "checkpoints" / "last.ckpt").unlink()
    resume = str(cut_dir / "checkpoints" / "last.ckpt")
    resumed = _federation(fmnist_root, cut_dir, method(), resume=resume, **kw)
    resumed.run()
    for key, value in full.method.state_dict().items():
        assert torch.equal(resumed.method.state_dict()[key], value), key
    assert "init_from" in json.loads((cut_dir / "run.json").read_text())


class _Teacher(FederatedMethod):
    """A method holding a teacher it does not say how to warm-start."""

    def __init__(self, network: Architecture) -> None:
        super().__init__(network)
        self.teacher = self._new_network()


def _refused_before_writing(fed: Federation, match: str) -> None:
    """``fed``'s set-up is refused, ValueError matching ``match``; its run folder is not made."""
    with pytest.raises(ValueError, match=match):
        fed.prepare()
    assert not fed.run_dir.exists()


def test_a_method_that_cannot_take_a_warm_start_is_refused_by_name(
    fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    fed = _federation(
        fmnist_root, tmp_path / "run", _Teacher(Architecture(10, 1)), init_from=str(source)
    )
    _refused_before_writing(fed, r"federation\.init_from: _Teacher holds .*teacher")


def test_a_network_of_another_class_count_is_refused_by_name(
    fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    """A source whose head has 5 classes, for a run on 10: refused naming the class counts."""
    ckpt = RunCheckpoint.load(source / "checkpoints" / "last.ckpt")
    head = sorted(k for k in ckpt.method_state if k.startswith("network.head."))
    for key in head:
        ckpt.method_state[key] = ckpt.method_state[key][:5].clone()
    other = tmp_path / "five" / "checkpoints" / "last.ckpt"
    ckpt.save(other)
    fed = _federation(
        fmnist_root, tmp_path / "run", ServerSL(Architecture(10, 1)), init_from=str(other)
    )
    _refused_before_writing(fed, r"federation\.init_from: .* it has 5 classes, .* 10")


def test_a_comparison_starts_each_seeds_runs_from_its_source_run(
    fmnist_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``init_from`` in a comparison spec: the source recipe runs first, once per setting and
    seed; every run of that seed starts from it (its row 0 scores the source's final network);
    the report names each source and its weights' SHA-256; a second invocation runs nothing."""
    out = tmp_path / "out"
    spec = {
        "name": "warm",
        "out": str(out),
        "recipes": [str(REPO / "recipes/server_sl.yaml")],
        "seeds": [0, 1],
        "overrides": [*tiny_overrides(fmnist_root, test_subset=200), "--federation.final_eval=[]"],
        "init_from": {
            "recipe": str(REPO / "recipes/server_sl.yaml"),
            "overrides": ["--federation.rounds=2"],
            "folder": "plateau",
        },
    }
    path = tmp_path / "warm.yaml"
    path.write_text(json.dumps(spec))
    main(["compare", f"--config={path}"])
    for seed in (0, 1):
        source = out / "default" / "plateau" / f"seed{seed}"
        assert load_run(source).rounds == 2 and load_run(source).finished
        run = load_run(out / "default" / "server_sl" / f"seed{seed}")
        assert run.init_from["path"] == str((source / "checkpoints/last.ckpt").resolve())
        assert run.summary["warm_start_test/acc"] == _source_acc(source)
        results = (out / "warm.md").read_text()
        assert "### Warm starts" in results and run.init_from["sha256"] in results
        # the source named from the comparison's folder, not by this machine's path
        assert f"| `default/plateau/seed{seed}/checkpoints/last.ckpt` |" in results
        assert str(out.resolve()) not in results.split("### Warm starts")[1]
    assert "*warm start*" in results
    capsys.readouterr()
    main(["compare", f"--config={path}"])
    assert "2 finished before" in (out / "warm.md").read_text()


def test_the_calibrated_spec_runs_every_recipe_on_one_protocol_from_its_plateau(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recipes/comparisons/fmnist_warm.yaml: sixteen methods, the oracle, the two centralized
    references and the ablations of FedCon, FedRGD and FedSwitch in recipes/ablations/, each
    (seed 0, IID) with the same data, rounds, client work (2 local epochs) and light server
    step (1 epoch of 100 labels in batches of 32), started from the plateau run of its setting
    and seed, which trains 400 epochs in batches of 16 on the same labeled set."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan
    from fedlit.comparison.plan import plan_sources

    monkeypatch.chdir(REPO)
    values = _spec("fmnist_warm")
    comparison = Comparison(**values | {"init_from": SourceRun(**values["init_from"])})
    stems = [Path(r).stem for r in comparison.recipes]
    references = {"server_sl", "fedavg_sl", "centralized_fixmatch", "centralized_fixmatch_joint"}
    ablations = {"fedcon_identity_projector", "fedrgd_one_group", "fedswitch_teacher_always"}
    assert len(stems) == 21 and references | ablations <= set(stems)
    assert comparison.baseline == "server_sl" and comparison.seeds == [0, 1, 2]
    assert comparison.jobs == 2 and set(comparison.settings) == {"iid", "noniid"}
    protocols = set()
    for run in plan(comparison):
        if run.seed != 0 or run.setting != "iid":
            continue
        config = resolve(run.args).config.as_dict()
        federation = {k: v for k, v in config["federation"].items() if "eval" not in k}
        assert federation["init_from"] == "runs/compare/fmnist_warm/iid/plateau/seed0"
        assert (federation["rounds"], federation["server_epochs"]) == (5, 1)
        assert (federation["local_epochs"], federation["clients_per_round"]) == (2, 10)
        optim = config["model"]["init_args"]["optim"]
        assert (optim["server_lr"], optim["client_lr"]) == (0.01, 0.03)
        data = config["data"]
        assert (data["batch_size"], data["examples_per_client"]) == (32, 300)
        assert data["labeled_per_class"] == 10
        protocols.add(json.dumps([data, federation, optim["lr_schedule"]], sort_keys=True))
    assert len(protocols) == 1
    (source,) = [s for s in plan_sources(comparison) if s.seed == 0 and s.setting == "iid"]
    config = resolve(source.args).config.as_dict()
    assert config["model"]["class_path"] == "fedlit.methods.ServerSL"
    assert (config["federation"]["rounds"], config["federation"]["server_epochs"]) == (1, 400)
    assert config["data"]["batch_size"] == 16
    assert config["model"]["init_args"]["optim"]["server_lr"] == 0.03
    labels = ("labeled_per_class", "val_per_class", "dataset")
    assert {k: config["data"][k] for k in labels} == {k: data[k] for k in labels}


def test_the_long_spec_is_the_calibrated_one_for_10_rounds() -> None:
    """recipes/comparisons/fmnist_warm_long.yaml: fmnist_warm's plateau, settings and
    overrides but 10 rounds, and its seeds and three more, for the baseline, the oracle, the
    joint reference, FixMatch and FedSEAL."""
    short, long = _spec("fmnist_warm"), _spec("fmnist_warm_long")
    stems = [Path(r).stem for r in long["recipes"]]
    assert stems == [
        "server_sl",
        "fedavg_sl",
        "centralized_fixmatch_joint",
        "fedavg_fixmatch",
        "fedseal",
    ]
    assert set(long["recipes"]) <= set(short["recipes"])
    rounds = {"--federation.rounds=5": "--federation.rounds=10"}
    assert long["overrides"] == [rounds.get(o, o) for o in short["overrides"]]
    for key in ("init_from", "settings", "baseline", "last_k", "jobs"):
        assert long[key] == short[key], key
    assert long["seeds"] == [0, 1, 2, 3, 4, 5] and set(short["seeds"]) <= set(long["seeds"])


def test_the_low_lr_spec_is_the_long_one_but_for_the_client_lr() -> None:
    """recipes/comparisons/fmnist_warm_long_low_lr.yaml: fmnist_warm_long's spec with the
    clients' learning rate at 0.01 instead of 0.03 and seeds 0-5, its own folder and
    document."""
    long, low = _spec("fmnist_warm_long"), _spec("fmnist_warm_long_low_lr")
    lr = {"--model.init_args.optim.client_lr=0.03": "--model.init_args.optim.client_lr=0.01"}
    assert low["overrides"] == [lr.get(o, o) for o in long["overrides"]] != long["overrides"]
    for key in ("init_from", "recipes", "settings", "baseline", "last_k", "jobs"):
        assert low[key] == long[key], key
    assert low["seeds"] == [0, 1, 2, 3, 4, 5] and set(long["seeds"]) <= set(low["seeds"])
    assert low["out"] != long["out"] and low["report"] != long["report"]


def test_the_lr02_spec_is_the_long_one_but_for_the_client_lr() -> None:
    """recipes/comparisons/fmnist_warm_long_lr02.yaml: fmnist_warm_long's spec with the
    clients' learning rate at 0.02 instead of 0.03, its own folder and document."""
    long, mid = _spec("fmnist_warm_long"), _spec("fmnist_warm_long_lr02")
    lr = {"--model.init_args.optim.client_lr=0.03": "--model.init_args.optim.client_lr=0.02"}
    assert mid["overrides"] == [lr.get(o, o) for o in long["overrides"]] != long["overrides"]
    for key in ("init_from", "recipes", "settings", "seeds", "baseline", "last_k", "jobs"):
        assert mid[key] == long[key], key
    others = [_spec(name) for name in ("fmnist_warm_long", "fmnist_warm_long_low_lr")]
    assert all(mid["out"] != o["out"] and mid["report"] != o["report"] for o in others)


def test_the_semifl_fl2_spec_runs_lr02s_protocol_on_both_methods_and_their_ablations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recipes/comparisons/fmnist_warm_semifl_fl2.yaml: fmnist_warm_long_lr02's protocol (its
    warm start, settings and overrides) on seeds 0-2, with SemiFL, (FL)^2 and every ablation
    recipe of theirs in recipes/ablations/; every planned run resolves to its recipe's
    method; its own folder and document."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan

    monkeypatch.chdir(REPO)
    mid, new = _spec("fmnist_warm_long_lr02"), _spec("fmnist_warm_semifl_fl2")
    for key in ("init_from", "settings", "overrides", "baseline", "last_k"):
        assert new[key] == mid[key], key
    assert new["seeds"] == [0, 1, 2] and new["out"] != mid["out"]
    ablations = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "recipes/ablations").glob("*.yaml")
        if p.stem.startswith(("semifl_", "fl2_"))
    )
    assert len(ablations) == 9 and set(new["recipes"]) == {
        *mid["recipes"][:4], "recipes/semifl.yaml", "recipes/fl2.yaml", *ablations
    }  # lr02's server_sl, fedavg_sl, centralized_fixmatch_joint and fedavg_fixmatch
    comparison = Comparison(**new | {"init_from": SourceRun(**new["init_from"])})
    classes = set()
    for run in plan(comparison):
        if run.seed == 0 and run.setting == "iid":
            classes.add(resolve(run.args).config.as_dict()["model"]["class_path"])
    assert {"fedlit.methods.SemiFL", "fedlit.methods.FL2"} <= classes


def test_the_headroom_sweep_varies_one_knob_a_point_on_lr02s_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recipes/comparisons/fmnist_headroom_sweep.yaml: lr02's warm start and overrides, the
    validation set as large as the training labels at every point; each point's planned runs
    resolve to the images, labels and epochs it names."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan

    monkeypatch.chdir(REPO)
    lr02, sweep = _spec("fmnist_warm_long_lr02"), _spec("fmnist_headroom_sweep")
    assert sweep["init_from"] == lr02["init_from"] and sweep["seeds"] == [0]
    assert [a for a in sweep["overrides"] if "val_per_class" not in a] == [
        a for a in lr02["overrides"] if "val_per_class" not in a
    ]
    comparison = Comparison(**sweep | {"init_from": SourceRun(**sweep["init_from"])})
    want = {  # images per client, labels per class, local epochs
        "n300": (300, 10, 2), "n1000": (1000, 10, 2), "n3000_e1": (3000, 10, 1),
        "n3000": (3000, 10, 2), "n3000_l5": (3000, 5, 2), "n3000_l25": (3000, 25, 2),
        "n5900": (5900, 10, 2),
    }  # fmt: skip
    seen = {}
    for run in plan(comparison):
        if run.run_dir.parent.name == "centralized_fixmatch_joint":
            config = resolve(run.args).config.as_dict()
            data = config["data"]
            assert data["val_per_class"] == data["labeled_per_class"]
            seen[run.setting] = (
                data["examples_per_client"], data["labeled_per_class"],
                config["federation"]["local_epochs"],
            )  # fmt: skip
    assert seen == want
    assert 10 * 5900 + 10 * (10 + 10) <= 60_000  # Fashion-MNIST's training set


def test_the_headroom_comparison_runs_the_sweeps_chosen_point_on_unseen_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stages 2 and 3 of the sweep (fmnist_headroom_sweep_seeds.yaml, _n3000.yaml) are stage
    1's n3000_e1 and n3000 points in its out, on seeds 0-2; fmnist_headroom.yaml runs that point's protocol on seeds 3-5, none of
    the sweep's, IID and Dirichlet(0.3), SemiFL's server step 10 epochs, with the every-label
    row."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan

    monkeypatch.chdir(REPO)
    sweep, seeds = _spec("fmnist_headroom_sweep"), _spec("fmnist_headroom_sweep_seeds")
    for stage, point in ((seeds, "n3000_e1"), (_spec("fmnist_headroom_sweep_n3000"), "n3000")):
        for key in ("out", "init_from", "overrides", "recipes", "baseline", "last_k"):
            assert stage[key] == sweep[key], key
        assert stage["settings"] == {point: sweep["settings"][point]}
        assert stage["seeds"] == [0, 1, 2]
    point = [*sweep["overrides"], *sweep["settings"]["n3000_e1"]]
    answer = _spec("fmnist_headroom")
    assert answer["init_from"] == sweep["init_from"] and answer["every_label"] is True
    assert not set(answer["seeds"]) & set(seeds["seeds"])
    comparison = Comparison(**answer | {"init_from": SourceRun(**answer["init_from"])})
    base = resolve(["--config=recipes/server_sl.yaml", *point]).config.as_dict()
    for run in plan(comparison):
        if run.seed != 3:
            continue
        config = resolve(run.args).config.as_dict()
        assert config["data"] == base["data"] | {"partitioner": config["data"]["partitioner"]}
        fed = config["federation"]
        assert (fed["rounds"], fed["local_epochs"]) == (10, 1)
        assert fed["server_epochs"] == (10 if run.method == "semifl" else 1)
        partitioner = config["data"]["partitioner"]
        if run.setting == "dir03":
            assert partitioner["init_args"]["alpha"] == 0.3
        else:
            assert partitioner == base["data"]["partitioner"]


def test_the_semifl_server_step_spec_changes_only_the_server_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recipes/comparisons/fmnist_warm_semifl_server_step.yaml: fmnist_warm_semifl_fl2's warm
    start, overrides and seeds, IID, with every run's server step 10 epochs a round."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan

    monkeypatch.chdir(REPO)
    first, step = _spec("fmnist_warm_semifl_fl2"), _spec("fmnist_warm_semifl_server_step")
    for key in ("init_from", "overrides", "seeds", "baseline", "last_k"):
        assert step[key] == first[key], key
    assert step["settings"] == {"iid_server10": ["--federation.server_epochs=10"]}
    assert set(step["recipes"]) < set(first["recipes"]) and step["out"] != first["out"]
    comparison = Comparison(**step | {"init_from": SourceRun(**step["init_from"])})
    runs = [run for run in plan(comparison) if run.seed == 0]
    assert len(runs) == 5
    for run in runs:
        assert resolve(run.args).config.as_dict()["federation"]["server_epochs"] == 10


def test_the_ramp_spec_adds_one_fedseal_ablation_to_the_lr02_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recipes/comparisons/fmnist_warm_long_lr02_ramp.yaml: fmnist_warm_long_lr02's protocol
    and run folder (its baseline, oracle and FedSEAL runs are that comparison's own, the same
    commands) and FedSEAL with lambda ramped over half the run, its one difference from
    recipes/fedseal.yaml; its own document."""
    from fedlit.cli import resolve
    from fedlit.comparison import Comparison, SourceRun, plan

    monkeypatch.chdir(REPO)
    mid, ramp = _spec("fmnist_warm_long_lr02"), _spec("fmnist_warm_long_lr02_ramp")
    for key in ("init_from", "settings", "seeds", "overrides", "baseline", "last_k", "jobs"):
        assert ramp[key] == mid[key], key
    assert ramp["out"] == mid["out"] and ramp["report"] != mid["report"]
    ablation = "recipes/ablations/fedseal_ramp_half.yaml"
    shared = ["recipes/server_sl.yaml", "recipes/fedavg_sl.yaml", "recipes/fedseal.yaml"]
    assert ramp["recipes"] == [*shared, ablation] and set(shared) <= set(mid["recipes"])

    def runs(values: dict[str, Any]) -> dict[tuple[str, str, int], tuple[str, ...]]:
        comparison = Comparison(**values | {"init_from": SourceRun(**values["init_from"])})
        return {(r.setting, r.recipe.stem, r.seed): r.args for r in plan(comparison)}

    mine, theirs = runs(ramp), runs(mid)
    assert all(mine[key] == theirs[key] for key in mine if key[1] != "fedseal_ramp_half")
    new = [key for key in mine if key not in theirs]
    assert len(new) == 12 and {key[1] for key in new} == {"fedseal_ramp_half"}
    (args,) = [mine[key] for key in new if key[0] == "noniid" and key[2] == 0]
    base = theirs[("noniid", "fedseal", 0)]
    configs = [resolve(list(a)).config.as_dict() for a in (args, base)]
    loss = [c["model"]["init_args"].pop("loss") for c in configs]
    assert (loss[0].pop("ramp"), loss[1].pop("ramp")) == (0.5, 0.25) and loss[0] == loss[1]
    for config in configs:
        config["trainer"].pop("default_root_dir")
        config.pop("config")
    assert configs[0] == configs[1]


@pytest.mark.slow  # worker processes start (about 30 s of CPU on 2 cores)
def test_a_warm_run_gives_the_same_weights_in_worker_processes(
    fmnist_root: Path, source: Path, tmp_path: Path
) -> None:
    """The warm start is server state, sent as a fresh run's network is: its clients in a pool
    of worker processes end the round with the in-process run's weights."""
    from fedlit.federation.pool import PoolSettings

    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count: equal results need equal counts
    try:
        for executor in ("local", "pool"):
            fed = _federation(
                fmnist_root,
                tmp_path / executor,
                FedAvgFixMatch(Architecture(10, 1), loss=FixMatchLoss(tau=0.5)),
                init_from=str(source),
                executor=executor,
                pool=PoolSettings(workers=2, threads=1),
            )
            fed.run()
            runs[executor] = fed.method.state_dict()
    finally:
        torch.set_num_threads(threads)
    for key, value in runs["local"].items():
        assert torch.equal(runs["pool"][key], value), key


def test_a_warm_start_keeps_the_networks_image_size(fmnist_root: Path, tmp_path: Path) -> None:
    """A backbone whose feature size depends on its images' side (``FlatConv``: 4 x 26 x 26
    at 28): a run starts from an identical network's run and scores what it scored (refused
    before: the template was built at the probe's 32, a (10, 3600) head against (10, 2704),
    "10 classes vs 10"); a run at another ``image_size`` is refused naming that setting."""
    from custom_backbones import FlatConv

    def sized(side: int) -> ServerSL:
        return ServerSL(Architecture(10, 1, backbone=FlatConv(1), image_size=side))

    source = tmp_path / "source"
    _federation(fmnist_root, source, sized(28), server_epochs=1).run()
    fed = _federation(fmnist_root, tmp_path / "warm", sized(28), init_from=str(source))
    fed.prepare()
    try:
        assert fed.server.evaluate()["test/acc"] == _source_acc(source)
    finally:
        fed.close()
    with pytest.raises(ValueError) as refused:
        load_warm_start(source, sized(32))
    assert str(refused.value) == (
        "federation.init_from: the source's network does not fit this run's: it has a head "
        "that takes 2704 features, this run's backbone gives 3600 at "
        "model.init_args.network.image_size=32: the source's images were of another size"
    )


def _same_state(a: object, b: object) -> bool:
    """Whether two checkpoints' method states hold the same values, tensor by tensor."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same_state, a, b))  # type: ignore[arg-type]
    return a == b


def test_settings_that_change_only_the_partition_share_one_source_run_per_seed(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Server-SL source trains on the server's data alone, which the partition does not
    change: IID and Dirichlet share one source run per seed (the first setting's), with the
    weights the non-IID source would have had. A source that trains clients, or a setting that
    changes the server's data, keeps one source per setting; so does a setting whose own
    source folder holds a run already."""
    from fedlit.comparison import Comparison, SourceRun, plan
    from fedlit.comparison.plan import plan_sources, source_settings

    dirichlet = [
        "--data.partitioner=fedlit.data.partition.Dirichlet",
        "--data.partitioner.init_args.alpha=0.5",
    ]
    values: dict = {
        "name": "share",
        "out": str(tmp_path / "out"),
        "recipes": [str(REPO / "recipes/server_sl.yaml")],
        "seeds": [0],
        "settings": {"iid": [], "noniid": dirichlet, "fewer": ["--data.labeled_per_class=3"]},
        "overrides": [*tiny_overrides(fmnist_root), "--federation.final_eval=[]"],
    }
    source = {"recipe": str(REPO / "recipes/server_sl.yaml"), "folder": "plateau"}
    comparison = Comparison(**values, init_from=SourceRun(**source))
    assert source_settings(comparison) == {"iid": "iid", "noniid": "iid", "fewer": "fewer"}
    assert [(s.setting, s.seed) for s in plan_sources(comparison)] == [("iid", 0), ("fewer", 0)]
    plateau = tmp_path / "out" / "iid" / "plateau" / "seed0"
    (noniid,) = [r for r in plan(comparison) if r.setting == "noniid"]
    assert f"--federation.init_from={plateau}" in noniid.args
    clients = SourceRun(**source | {"recipe": str(REPO / "recipes/fedavg_sl.yaml")})
    federated = Comparison(**values, init_from=clients)
    assert source_settings(federated) == {"iid": "iid", "noniid": "noniid", "fewer": "fewer"}
    # the premise: the non-IID source, run on its own, has the shared source's weights
    (shared,) = [s for s in plan_sources(comparison) if s.setting == "iid"]
    assert shared.args[-1].startswith("--trainer.default_root_dir=")
    own = tmp_path / "own_noniid_source"
    main(["fit", *shared.args[:-1], *dirichlet, f"--trainer.default_root_dir={own}"])
    main(["fit", *shared.args[:-1], f"--trainer.default_root_dir={tmp_path / 'iid_source'}"])
    states = [
        RunCheckpoint.load(d / "checkpoints" / "last.ckpt").method_state
        for d in (own, tmp_path / "iid_source")
    ]
    assert _same_state(*states)
    # a setting whose own source folder holds a run keeps it
    kept = tmp_path / "out" / "noniid" / "plateau" / "seed0"
    kept.mkdir(parents=True)
    (kept / "metrics.csv").write_text("round\n")
    assert source_settings(comparison)["noniid"] == "noniid"
