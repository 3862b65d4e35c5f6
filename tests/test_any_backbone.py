"""Any backbone: torchvision and timm models by name, a user's class by import path or as an
instance; the classifier stripped, the input channels adapted, BatchNorm swapped, pretrained
weights from a local file; refusals naming the key or the file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from custom_backbones import TinyNet
from torch import nn
from torchvision.models import resnet18

from fedlit.cli import main
from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig, load_checkpoint
from fedlit.methods import FedSup, ServerSL
from fedlit.models import Architecture, ModuleBackbone, build_backbone, build_classifier, has_stages

REPO = Path(__file__).parents[1]


def _resnet18_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return resnet18(weights=None).state_dict()


def test_torchvision_model_stripped_and_adapted_to_grey_images() -> None:
    """conv1 summed over RGB: a grey image gives what the original gives on it repeated 3x."""
    torch.manual_seed(0)
    original = resnet18(weights=None).eval()
    original.fc = nn.Identity()
    torch.manual_seed(0)
    grey = build_backbone("torchvision/resnet18", in_channels=1, image_size=28).eval()
    assert isinstance(grey, ModuleBackbone) and grey.feature_dim == 512
    assert isinstance(grey.body.fc, nn.Identity)
    assert grey.body.conv1.weight.shape == (64, 1, 7, 7)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(grey(x), original(x.repeat(1, 3, 1, 1)), rtol=1e-4, atol=1e-5)


def test_torchvision_resnet_stages_give_its_features() -> None:
    """FedSup's stage maps: layer1..layer4, and pooling the last gives the features."""
    backbone = build_backbone("torchvision/resnet18", in_channels=3).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        maps = backbone.feature_maps(x)
        assert [m.shape[1] for m in maps] == [64, 128, 256, 512]
        torch.testing.assert_close(backbone.pool(maps[-1]), backbone(x))
    assert has_stages(backbone)
    assert not has_stages(build_backbone("torchvision/squeezenet1_0", in_channels=3))


def test_weights_file_is_loaded_as_saved(tmp_path: Path) -> None:
    saved = _resnet18_state(1)
    path = tmp_path / "resnet18.pth"
    torch.save(saved, path)
    rgb = build_classifier("torchvision/resnet18", 10, 3, weights=str(path)).backbone.body
    for key, value in rgb.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0, msg=key)
    grey = build_classifier("torchvision/resnet18", 10, 1, weights=str(path)).backbone.body
    torch.testing.assert_close(grey.conv1.weight, saved["conv1.weight"].sum(1, keepdim=True))
    torch.testing.assert_close(grey.layer4[1].bn2.running_var, saved["layer4.1.bn2.running_var"])


def test_a_method_starts_from_the_weights_file(tmp_path: Path) -> None:
    """The initial global backbone (also after the run's re-draw) holds the file's weights;
    the head is drawn."""
    torch.manual_seed(3)
    saved = build_backbone("small_cnn", in_channels=1).state_dict()
    path = tmp_path / "small_cnn.pt"
    torch.save(saved, path)
    method = ServerSL(Architecture(10, 1, backbone_weights=str(path)))
    method.initialize()
    for key, value in method.network.backbone.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0, msg=key)
    client = method.client_side().architecture.build()  # a client's: weights come by payload
    assert not torch.equal(client.backbone.stages[0][0].weight, saved["stages.0.0.weight"])


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        (b"not a pickle", "torch.load(weights_only=True)"),
        ("resnet18", "does not fit"),
    ],
)
def test_a_weights_file_that_is_missing_or_does_not_fit_is_refused(
    content: bytes | str | None, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "w.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "resnet18":
        torch.save(_resnet18_state(0), path)
    with pytest.raises(ValueError, match="model.network.backbone_weights") as err:
        ServerSL(Architecture(10, 1, backbone_weights=str(path)))
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_module_instance_passes_straight_in_with_its_weights() -> None:
    torch.manual_seed(0)
    mine = TinyNet(in_channels=1, width=6)
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    method = ServerSL(Architecture(10, 1, backbone=mine))
    method.initialize()
    body = method.network.backbone.body
    assert body is not mine and method.network.backbone.feature_dim == 6
    for key, value in body.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    with torch.no_grad():
        body.conv.weight.add_(1.0)
    assert torch.equal(mine.conv.weight, before["conv.weight"])  # the instance is not changed
    assert not any(k.startswith("backbone_source") for k in method.state_dict())


def test_norm_swaps_batchnorm_or_is_refused_where_there_is_none() -> None:
    gn = build_backbone("torchvision/resnet18", in_channels=3, norm="gn")
    kinds = {type(m) for m in gn.modules()}
    assert nn.GroupNorm in kinds and nn.BatchNorm2d not in kinds
    none = build_backbone(TinyNet(3), in_channels=3, norm="none")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in none.modules())
    with pytest.raises(ValueError, match="model.network.norm='gn'.*no BatchNorm2d"):
        build_backbone("torchvision/squeezenet1_0", in_channels=3, norm="gn")


def test_a_class_path_gets_the_data_channels_where_it_takes_them() -> None:
    backbone = build_backbone("custom_backbones.TinyNet", in_channels=1, image_size=28)
    assert isinstance(backbone, ModuleBackbone)
    assert backbone.body.conv.in_channels == 1 and backbone.feature_dim == 8


def test_timm_missing_is_refused_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(
        ValueError, match=r"model.network.backbone='timm/resnet18': timm is not installed"
    ):
        build_backbone("timm/resnet18", in_channels=3)


def test_timm_model_where_installed() -> None:
    pytest.importorskip("timm")
    backbone = build_backbone("timm/resnet10t", in_channels=1, image_size=28)
    assert backbone.feature_dim == 512
    assert backbone(torch.zeros(2, 1, 28, 28)).shape == (2, 512)


def test_fedsup_refuses_a_backbone_without_stages() -> None:
    with pytest.raises(ValueError, match="FedSup's client loss compares the feature maps"):
        FedSup(Architecture(10, 1, backbone=TinyNet(1)))


def test_python_api_runs_a_round_with_a_module_instance(tmp_path: Path) -> None:
    data = FederatedDataModule(
        "synthetic",
        root=str(tmp_path / "data"),
        num_clients=2,
        examples_per_client=16,
        labeled_per_class=2,
        val_per_class=0,
        test_subset=50,
    )
    method = ServerSL(Architecture(data.num_classes, data.in_channels, backbone=TinyNet(1)))
    result = Federation(
        method, data, FederationConfig(rounds=1, clients_per_round=2), run_dir=tmp_path / "run"
    ).run()
    assert 0 <= result.final["test/acc"] <= 1


def _tiny_fit(tmp_path: Path, recipe: str, *args: str) -> list[str]:
    return [
        "fit",
        f"--config={REPO / 'recipes' / f'{recipe}.yaml'}",
        "--data.dataset=synthetic",
        f"--data.root={tmp_path / 'data'}",
        "--data.num_clients=2",
        "--data.examples_per_client=16",
        "--data.client_batch_size=8",
        "--data.labeled_per_class=2",
        "--data.val_per_class=0",
        "--data.test_subset=50",
        "--federation.rounds=1",
        "--federation.clients_per_round=2",
        "--federation.server_epochs=1",
        "--federation.local_epochs=1",
        "--federation.final_eval=[]",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        *args,
    ]


@pytest.mark.parametrize(
    ("recipe", "backbone"),
    [("fedavg_sl", "custom_backbones.TinyNet"), ("server_sl", "torchvision/resnet18")],
    ids=["class_path", "torchvision"],
)
def test_cli_runs_a_round_with_any_backbone(
    recipe: str, backbone: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One tiny round through the CLI (the clients' networks built from a class path too)."""
    main(_tiny_fit(tmp_path, recipe, f"--model.init_args.network.backbone={backbone}"))
    assert '"test/acc"' in capsys.readouterr().out
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_cli_takes_class_path_and_init_args(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "model:\n"
        "  init_args:\n"
        "    network:\n"
        "      backbone:\n"
        "        class_path: custom_backbones.TinyNet\n"
        "        init_args: {in_channels: 1, width: 4}\n"
    )
    main(_tiny_fit(tmp_path, "server_sl", f"--config={recipe}"))
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "class_path: custom_backbones.TinyNet" in config and "width: 4" in config


def test_cli_refuses_a_weights_file_that_does_not_fit_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(_resnet18_state(0), path)  # torchvision's ResNet-18, not the small CNN
    with pytest.raises(SystemExit) as exc:
        main(_tiny_fit(tmp_path, "server_sl", f"--model.init_args.network.backbone_weights={path}"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exc.value.code == 2 and len(lines) == 1, err
    assert "model.init_args.network.backbone_weights" in lines[0] and str(path) in lines[0]
    assert "does not fit 'small_cnn'" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_class_path_run_is_deterministic(tmp_path: Path) -> None:
    """Same config and seed: the same final weights (the module is built after the seed)."""
    states = []
    for name in ("a", "b"):
        main(
            _tiny_fit(
                tmp_path / name,
                "fedavg_sl",
                "--model.init_args.network.backbone=custom_backbones.TinyNet",
            )
        )
        ckpt = load_checkpoint(tmp_path / name / "run" / "checkpoints" / "last.ckpt")
        states.append(ckpt["method_state"])
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
