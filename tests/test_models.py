"""Tests of fedlit.models: shapes, paper 001 parameter counts, norm switch, errors, learning."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlit.models import (
    BACKBONES,
    NORMS,
    Backbone,
    Classifier,
    FedConCIFARCNN,
    FedConMNISTCNN,
    ResNet18,
    SmallCNN,
    build_classifier,
    make_norm,
)

# (backbone name, input sizes it supports, expected feature_dim, expected number of stages)
CASES = [
    ("small_cnn", (28, 32), 128, 3),
    ("fedcon_mnist_cnn", (28,), 320, 2),
    ("fedcon_cifar_cnn", (32,), 4096, 3),
    ("resnet18", (28, 32), 512, 4),
]
SHAPE_CASES = [
    (name, channels, size, dim, stages)
    for name, sizes, dim, stages in CASES
    for channels in (1, 3)
    for size in sizes
]


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def norm_types(module: nn.Module) -> set[type]:
    return {type(m) for m in module.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))}


@pytest.mark.parametrize(("name", "channels", "size", "dim", "stages"), SHAPE_CASES)
def test_shapes_and_feature_maps(name: str, channels: int, size: int, dim: int, stages: int):
    torch.manual_seed(0)
    backbone = BACKBONES[name](in_channels=channels).eval()
    x = torch.randn(2, channels, size, size)
    assert backbone.feature_dim == dim
    with torch.no_grad():
        features = backbone(x)
        maps = backbone.feature_maps(x)
        model = Classifier(backbone, num_classes=7, hidden=(16,)).eval()
        logits = model(x)
    assert features.shape == (2, dim)
    assert logits.shape == (2, 7)
    assert len(maps) == stages
    assert all(m.dim() == 4 and m.shape[0] == 2 for m in maps)
    last = maps[-1]
    if name in ("small_cnn", "resnet18"):
        expected = F.adaptive_avg_pool2d(last, 1).flatten(1)
    else:
        expected = last.flatten(1)
    torch.testing.assert_close(features, expected)


def test_stage_shapes():
    x32 = torch.zeros(1, 3, 32, 32)
    with torch.no_grad():
        resnet = [tuple(m.shape[1:]) for m in ResNet18().eval().feature_maps(x32)]
        cifar = [tuple(m.shape[1:]) for m in FedConCIFARCNN().eval().feature_maps(x32)]
        mnist = [
            tuple(m.shape[1:])
            for m in FedConMNISTCNN().eval().feature_maps(torch.zeros(1, 1, 28, 28))
        ]
        small = [tuple(m.shape[1:]) for m in SmallCNN(in_channels=3).feature_maps(x32)]
    assert resnet == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]
    assert cifar == [(64, 16, 16), (128, 8, 8), (256, 4, 4)]
    assert mnist == [(10, 12, 12), (20, 4, 4)]
    assert small == [(32, 16, 16), (64, 8, 8), (128, 8, 8)]


def test_wrong_input_size_for_fedcon_cnns():
    with pytest.raises(ValueError, match="28x28"):
        FedConMNISTCNN()(torch.zeros(1, 1, 32, 32))
    with pytest.raises(ValueError, match="32x32"):
        FedConCIFARCNN().eval()(torch.zeros(1, 3, 40, 40))


def test_paper_001_parameter_counts():
    mnist = build_classifier("fedcon_mnist_cnn", num_classes=10, in_channels=1)
    cifar = build_classifier("fedcon_cifar_cnn", num_classes=10, in_channels=3)
    assert n_params(mnist) == 21_840
    assert n_params(cifar) == 5_852_170
    assert [m.out_features for m in mnist.head if isinstance(m, nn.Linear)] == [50, 10]
    assert [m.out_features for m in cifar.head if isinstance(m, nn.Linear)] == [1024, 512, 10]
    assert [m.p for m in cifar.head if isinstance(m, nn.Dropout)] == [0.1, 0.1]
    assert cifar.backbone.stages[1][-1].p == 0.05


def test_defaults():
    small = build_classifier("small_cnn", num_classes=10, in_channels=1)
    resnet = build_classifier("resnet18", num_classes=10, in_channels=3)
    assert len(small.head) == 1 and len(resnet.head) == 1  # default_head = ()
    assert norm_types(small) == {nn.BatchNorm2d}
    assert norm_types(build_classifier("fedcon_mnist_cnn", 10, 1)) == set()
    conv1 = resnet.backbone.conv1
    assert (conv1.kernel_size, conv1.stride, conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert isinstance(resnet.backbone.maxpool, nn.Identity)
    assert not hasattr(resnet.backbone, "fc")
    custom = build_classifier("small_cnn", 5, 3, head=(8, 4), head_dropout=0.2)
    assert [m.out_features for m in custom.head if isinstance(m, nn.Linear)] == [8, 4, 5]
    assert [m.p for m in custom.head if isinstance(m, nn.Dropout)] == [0.2, 0.2]


@pytest.mark.parametrize("name", list(BACKBONES))
@pytest.mark.parametrize("norm", NORMS)
def test_norm_switch(name: str, norm: str):
    model = build_classifier(name, num_classes=10, in_channels=3, norm=norm)
    expected = {"bn": {nn.BatchNorm2d}, "gn": {nn.GroupNorm}, "none": set()}[norm]
    assert norm_types(model) == expected
    for module in model.modules():
        if isinstance(module, nn.GroupNorm):
            assert module.num_channels % module.num_groups == 0


def test_make_norm():
    assert isinstance(make_norm("bn", 16), nn.BatchNorm2d)
    assert isinstance(make_norm("none", 16), nn.Identity)
    assert make_norm("gn", 64).num_groups == 32
    assert make_norm("gn", 10).num_groups == 10
    assert make_norm("gn", 48).num_groups == 24
    with pytest.raises(ValueError, match="model.network.norm"):
        make_norm("ln", 8)


@pytest.mark.parametrize("name", list(BACKBONES))
def test_state_dict_keys(name: str):
    model = build_classifier(name, num_classes=10, in_channels=1)
    keys = list(model.state_dict())
    assert keys
    assert all(k.startswith(("backbone.", "head.")) for k in keys)
    assert any(k.startswith("head.") for k in keys)
    assert isinstance(model.backbone, Backbone)


def test_errors_name_config_keys():
    with pytest.raises(ValueError, match="model.network.backbone") as err:
        build_classifier("vgg", num_classes=10, in_channels=3)
    assert "'vgg'" in str(err.value) and "resnet18" in str(err.value)
    with pytest.raises(ValueError, match="model.network.norm") as err:
        build_classifier("small_cnn", num_classes=10, in_channels=3, norm="layer")
    assert all(repr(n) in str(err.value) for n in NORMS)
    with pytest.raises(ValueError, match="model.network.norm"):
        SmallCNN(norm="batch")


def test_small_cnn_learns():
    torch.manual_seed(0)
    model = Classifier(SmallCNN(in_channels=1, width=16), num_classes=10)
    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(20):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # about 2.3 -> 0.6
