"""Any network as a backbone: fedlit's own by name, a torchvision or timm model by name, a
class by its import path, or an ``nn.Module`` instance.

A backbone value (``model.network.backbone``) is resolved in this order:

* a name of :data:`~fedlit.models.classifier.BACKBONES` (``small_cnn``, ``resnet18``, ...);
* ``torchvision/<name>``: ``torchvision.models.get_model(name)``, its classifier (``fc``,
  ``classifier``, ``head`` or ``heads``) replaced by ``Identity``;
* ``timm/<name>``: ``timm.create_model(name, num_classes=0)`` (timm strips its own
  classifier), where timm is installed (``pip install "fedlit[timm]"``);
* a dotted import path (``mypackage.nets.MyNet``): a class or function returning an
  ``nn.Module`` of images -> features, called with ``in_channels`` (and ``norm``) where it takes
  them;
* an ``nn.Module`` instance (the Python API, or ``class_path``/``init_args`` in YAML, which
  jsonargparse builds): copied, with the weights it holds.

Then, in this order: pretrained weights (``model.network.backbone_weights``: a local file, or
``download`` for torchvision's and timm's own) are loaded into the network as its source builds
it; the first convolution is adapted to the data's channels; ``model.network.norm`` replaces its
BatchNorm layers; and one forward of a zero batch finds the feature dimension.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedlit.models.backbones import Backbone, check_norm, group_count

TORCHVISION = "torchvision/"
TIMM = "timm/"
DOWNLOAD = "download"
"""``model.network.backbone_weights: download``: torchvision's ``DEFAULT`` weights or timm's
``pretrained=True``, fetched from the internet (cached by torch hub / Hugging Face)."""

PROBE_SIZE = 32
"""Side of the zero images a wrapped network's feature dimension is found with when the data's
image size is not given (``model.network.image_size: null``)."""

CLASSIFIER_ATTRIBUTES = ("fc", "classifier", "head", "heads")
"""The attributes holding a torchvision model's classifier (ResNet/RegNet: ``fc``; VGG,
MobileNet, EfficientNet, DenseNet, ConvNeXt: ``classifier``; Swin: ``head``; ViT: ``heads``)."""

StateDict = Mapping[str, Tensor]


def describe(backbone: str | nn.Module) -> str:
    """A short name of ``backbone`` for messages and logs: the string, or the module's class
    path."""
    if isinstance(backbone, str):
        return backbone
    cls = type(backbone)
    return f"{cls.__module__}.{cls.__qualname__}"


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


class ModuleBackbone(Backbone):
    """Any ``nn.Module`` of images as a :class:`~fedlit.models.Backbone`.

    ``body`` maps images (N, C, H, W) to features (N, D), or to maps (N, D, h, w) that are
    globally average-pooled to (N, D); a tuple output (torchvision's Inception in training)
    gives its first element. ``stages`` names the body's submodules whose outputs are its
    stage maps (:meth:`feature_maps`, FedSup's feature-map loss): the last stage's map, average
    pooled, must be the features. None: the body has no known stages.
    """

    def __init__(
        self, body: nn.Module, feature_dim: int, stages: tuple[str, ...] | None = None
    ) -> None:
        super().__init__()
        self.body = body
        self.feature_dim = feature_dim
        self.stage_names = stages

    def forward(self, x: Tensor) -> Tensor:
        """Images (N, C, H, W) -> features (N, feature_dim)."""
        return flat_features(self.body(x))

    def feature_maps(self, x: Tensor) -> list[Tensor]:
        """The outputs of the stages (N, C_i, H_i, W_i), in order, from one forward."""
        if self.stage_names is None:
            raise ValueError(f"{describe(self.body)} has no known stages")
        maps: list[Tensor] = []
        hooks = [
            self.body.get_submodule(name).register_forward_hook(
                lambda _m, _i, out: maps.append(out)
            )
            for name in self.stage_names
        ]
        try:
            self.body(x)
        finally:
            for hook in hooks:
                hook.remove()
        return maps

    def pool(self, last: Tensor) -> Tensor:
        """Last stage map (N, C, h, w) -> (N, C) by global average pooling."""
        return flat_features(last)


def flat_features(out: Any) -> Tensor:
    """A network's output as features: (N, D) unchanged, (N, D, h, w) average-pooled, a tuple's
    first element; ValueError for anything else."""
    if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
        out = out[0]
    if not isinstance(out, Tensor):
        raise ValueError(f"it returns {type(out).__name__}, not a tensor of features")
    if out.dim() == 2:
        return out
    if out.dim() == 4:
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
    raise ValueError(
        f"it returns a tensor of shape {tuple(out.shape)}; features are (N, D) or (N, D, h, w)"
    )


# --- the network each source builds -----------------------------------------------------------
def torchvision_model(name: str, download: bool) -> nn.Module:
    """``torchvision.models.get_model(name)`` (with its ``DEFAULT`` weights if ``download``)."""
    from torchvision import models

    known = models.list_models(module=models)
    if name not in known:
        raise ValueError(
            f"model.network.backbone={TORCHVISION + name!r}: torchvision has no classification "
            f"model {name!r} (torchvision.models.list_models(): {', '.join(known[:6])}, ...)"
        )
    if not download:
        return models.get_model(name, weights=None)
    try:
        return models.get_model(name, weights="DEFAULT")
    except (OSError, RuntimeError, ValueError) as err:  # URLError is an OSError
        raise ValueError(
            f"model.network.backbone_weights={DOWNLOAD!r}: torchvision could not download {name}'s "
            f"weights (this needs a network): {first_line(err)}; put the file on this machine "
            "and give its path instead"
        ) from err


def timm_model(name: str, download: bool) -> nn.Module:
    """``timm.create_model(name, num_classes=0)``: timm's model without its classifier."""
    try:
        import timm
    except ImportError as err:
        raise ValueError(
            f"model.network.backbone={TIMM + name!r}: timm is not installed; install it with "
            'pip install "fedlit[timm]" (or pip install timm)'
        ) from err
    if not timm.is_model(name):
        raise ValueError(f"model.network.backbone={TIMM + name!r}: timm has no model {name!r}")
    try:
        return timm.create_model(name, pretrained=download, num_classes=0)
    except (OSError, RuntimeError) as err:
        if not download:
            raise
        raise ValueError(
            f"model.network.backbone_weights={DOWNLOAD!r}: timm could not download {name}'s "
            f"weights (this needs a network): {first_line(err)}; put the file on this machine "
            "and give its path instead"
        ) from err


def imported(path: str) -> Callable[..., Any]:
    """The class or function at the dotted import ``path``; ValueError naming the key."""
    module_name, _, attribute = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"model.network.backbone={path!r}: cannot import it ({first_line(err)})"
        ) from err
    if not callable(found):
        raise ValueError(f"model.network.backbone={path!r}: not a class or function")
    return found


def called_with_what_it_takes(factory: Callable[..., Any], path: str, **offered: Any) -> nn.Module:
    """``factory(**the offered arguments its signature names)``; it must give an nn.Module."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    kwargs = {k: v for k, v in offered.items() if k in parameters and v is not None}
    try:
        module = factory(**kwargs)
    except Exception as err:  # the user's code: any failure is the setting's
        raise ValueError(
            f"model.network.backbone={path!r}: building it failed: {first_line(err)}"
        ) from err
    if not isinstance(module, nn.Module):
        raise ValueError(
            f"model.network.backbone={path!r}: it gives {type(module).__name__}, not an nn.Module"
        )
    return module


# --- weights --------------------------------------------------------------------------------
def read_weights(path: str) -> dict[str, Tensor]:
    """The state dict in file ``path``, read with ``torch.load(weights_only=True)``;
    ValueError naming ``model.network.backbone_weights`` and the file where it cannot be."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder" if file.is_dir() else "does not exist"
        raise ValueError(f"model.network.backbone_weights={path!r}: the file {what}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling: any failure means the file is not a state dict
        raise ValueError(
            f"model.network.backbone_weights={path!r}: not a weights file "
            f"torch.load(weights_only=True) reads ({first_line(err)})"
        ) from err
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]  # a checkpoint that wraps its state dict
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise ValueError(
            f"model.network.backbone_weights={path!r}: not a state dict "
            "(a mapping of names to tensors)"
        )
    return dict(state)


def load_weights(
    module: nn.Module, state: StateDict, path: str, label: str, classifier: tuple[str, ...] = ()
) -> None:
    """Load ``state`` into ``module``: every key must fit, except those of the classifier
    (under a prefix of ``classifier``), which is stripped after. ValueError naming the file."""
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as err:
        shapes = [s.strip() for s in str(err).splitlines() if "size mismatch" in s]
        why = shapes[0] if shapes else first_line(err)
        raise ValueError(
            f"model.network.backbone_weights={path!r} does not fit {label}: {why}"
        ) from err
    prefixes = tuple(p + "." for p in classifier)
    missing = [k for k in result.missing_keys if not k.startswith(prefixes)]
    unexpected = [k for k in result.unexpected_keys if not k.startswith(prefixes)]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of its weights missing (e.g. {missing[0]!r})")
        if unexpected:
            parts.append(f"{len(unexpected)} keys it does not have (e.g. {unexpected[0]!r})")
        raise ValueError(
            f"model.network.backbone_weights={path!r} does not fit {label}: " + " and ".join(parts)
        )


# --- adaptations ----------------------------------------------------------------------------
def strip_classifier(model: nn.Module) -> nn.Module:
    """``model`` with its classifier attribute (:data:`CLASSIFIER_ATTRIBUTES`, the first it
    has) replaced by ``Identity``, in place."""
    for name in CLASSIFIER_ATTRIBUTES:
        if isinstance(getattr(model, name, None), nn.Module):
            setattr(model, name, nn.Identity())
            break
    return model


def adapted_conv_weight(weight: Tensor, in_channels: int) -> Tensor:
    """A convolution's weight (O, C, k, k) for ``in_channels`` inputs (timm's rule): summed
    over C for one channel (so a grey image x gives what the original gives on x repeated C
    times); otherwise the C channels repeated cyclically and scaled by C / in_channels."""
    if in_channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = -(-in_channels // weight.shape[1])
    return weight.repeat(1, repeats, 1, 1)[:, :in_channels] * (weight.shape[1] / in_channels)


def adapt_input_channels(model: nn.Module, in_channels: int) -> nn.Module:
    """Replace ``model``'s first ``Conv2d`` (in ``named_modules`` order) by one taking
    ``in_channels`` (weights by :func:`adapted_conv_weight`), in place, where it takes another
    number; a model without one, or whose first one is grouped, is left as it is."""
    for name, conv in model.named_modules():
        if not isinstance(conv, nn.Conv2d):
            continue
        if conv.in_channels == in_channels or conv.groups != 1:
            return model
        new = nn.Conv2d(
            in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            conv.stride,  # type: ignore[arg-type]
            conv.padding,  # type: ignore[arg-type]
            conv.dilation,  # type: ignore[arg-type]
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
        )
        with torch.no_grad():
            new.weight.copy_(adapted_conv_weight(conv.weight, in_channels))
            if conv.bias is not None and new.bias is not None:
                new.bias.copy_(conv.bias)
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, new)
        return model
    return model


def swap_batchnorm(model: nn.Module, norm: str, label: str) -> nn.Module:
    """``model`` with every ``BatchNorm2d`` replaced, in place: ``gn`` by ``GroupNorm`` over
    the same channels (groups by :func:`~fedlit.models.backbones.group_count`, weight 1, bias
    0), ``none`` by ``Identity``; ``bn`` keeps them. ValueError naming ``model.network.norm`` if the
    model has none to replace."""
    check_norm(norm)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    if not found:
        raise ValueError(
            f"model.network.norm={norm!r}: {label} has no BatchNorm2d layer to make {norm!r}; "
            "model.network.norm: null keeps its own normalisation"
        )
    if norm == "bn":
        return model
    for name, bn in found:
        channels = bn.num_features
        new = nn.GroupNorm(group_count(channels), channels) if norm == "gn" else nn.Identity()
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, new)
    return model


def torchvision_stages(model: nn.Module) -> tuple[str, ...] | None:
    """The stage names of a torchvision ResNet-like model (``layer1`` .. ``layer4`` followed by
    global average pooling), else None."""
    names = ("layer1", "layer2", "layer3", "layer4")
    if all(isinstance(getattr(model, n, None), nn.Module) for n in names) and isinstance(
        getattr(model, "avgpool", None), nn.AdaptiveAvgPool2d
    ):
        return names
    return None


def probe(body: nn.Module, shape: tuple[int, int, int], label: str) -> Tensor:
    """Features of one zero batch (2, C, H, W) of ``shape`` (C, H, W), the module in eval mode
    and without gradients (no random draw, no statistics updated); ValueError naming
    ``model.network.backbone`` if the network cannot take it."""
    was_training = body.training
    body.eval()
    try:
        with torch.no_grad():
            out = body(torch.zeros(2, *shape).to(memory_format=torch.channels_last))
            return out if isinstance(body, Backbone) else flat_features(out)
    except Exception as err:  # any failure of a forward means the network does not fit
        raise ValueError(
            f"model.network.backbone={label!r} does not fit the data's images ({_shape(shape)}): "
            f"{first_line(err)}"
        ) from err
    finally:
        body.train(was_training)


def _shape(shape: tuple[int, int, int]) -> str:
    return "x".join(map(str, shape))


def check_input_fits(backbone: Backbone, shape: tuple[int, int, int], label: str) -> None:
    """Raise ValueError naming ``model.network.backbone`` unless one forward of a zero batch of
    images of ``shape`` (C, H, W) gives features (2, backbone.feature_dim)."""
    features = probe(backbone, shape, label)
    if tuple(features.shape) != (2, backbone.feature_dim):
        raise ValueError(
            f"model.network.backbone={label!r} does not fit the data's images ({_shape(shape)}): "
            f"it gives features of shape {tuple(features.shape)}, not (2, {backbone.feature_dim})"
        )


def has_stages(backbone: Backbone) -> bool:
    """Whether ``backbone.feature_maps`` gives its stage maps (fedlit's backbones, a user's
    :class:`~fedlit.models.Backbone` with ``stages`` or its own ``feature_maps``, a torchvision
    ResNet)."""
    if isinstance(backbone, ModuleBackbone):
        return backbone.stage_names is not None
    return hasattr(backbone, "stages") or type(backbone).feature_maps is not Backbone.feature_maps


# --- the whole resolution -------------------------------------------------------------------
def source_network(
    backbone: str | nn.Module,
    in_channels: int,
    norm: str | None,
    download: bool,
) -> tuple[nn.Module, tuple[str, ...], bool]:
    """The network ``backbone`` names, as its source builds it, with the prefixes of its
    classifier's keys (which a weights file may hold) and whether it took ``in_channels`` and
    ``norm`` itself."""
    label = describe(backbone)
    if isinstance(backbone, nn.Module):
        if download:
            raise ValueError(
                f"model.network.backbone_weights={DOWNLOAD!r}: only torchvision/ and timm/ "
                "backbones download weights; give a file's path"
            )
        return copy.deepcopy(backbone), (), False
    if backbone.startswith(TORCHVISION):
        model = torchvision_model(backbone[len(TORCHVISION) :], download)
        return model, CLASSIFIER_ATTRIBUTES, False
    if backbone.startswith(TIMM):
        model = timm_model(backbone[len(TIMM) :], download)
        head = str(getattr(model, "pretrained_cfg", {}).get("classifier") or "")
        return model, (head,) if head else (), False
    if download:
        raise ValueError(
            f"model.network.backbone_weights={DOWNLOAD!r}: only torchvision/ and timm/ backbones "
            "download weights; give a file's path"
        )
    factory = imported(backbone)
    module = called_with_what_it_takes(
        factory, label, in_channels=in_channels, norm=check_norm(norm) if norm else None
    )
    takes = inspect.signature(factory).parameters if _has_signature(factory) else {}
    return module, (), "in_channels" in takes and (norm is None or "norm" in takes)


def _has_signature(factory: Callable[..., Any]) -> bool:
    try:
        inspect.signature(factory)
    except (TypeError, ValueError):
        return False
    return True


def wrap_module(
    backbone: str | nn.Module,
    in_channels: int,
    norm: str | None,
    image_size: int | None,
    weights: str | None,
) -> Backbone:
    """A :class:`Backbone` from a torchvision/timm name, an import path or a module (see the
    module's docstring for the steps)."""
    label = describe(backbone)
    download = weights == DOWNLOAD
    module, classifier, built_for_data = source_network(backbone, in_channels, norm, download)
    if weights is not None and not download:
        load_weights(module, read_weights(weights), weights, label, classifier)
    if isinstance(backbone, str) and backbone.startswith(TORCHVISION):
        strip_classifier(module)
    if not built_for_data:
        adapt_input_channels(module, in_channels)
        if norm is not None:
            swap_batchnorm(module, norm, label)
    if isinstance(module, Backbone):
        return module  # a fedlit backbone of the user's: its own feature_dim and stages
    size = image_size or PROBE_SIZE
    features = probe(module, (in_channels, size, size), label)
    stages = torchvision_stages(module) if backbone_is_torchvision(backbone) else None
    return ModuleBackbone(module, int(features.shape[1]), stages)


def backbone_is_torchvision(backbone: str | nn.Module) -> bool:
    return isinstance(backbone, str) and backbone.startswith(TORCHVISION)
