"""Shared pieces of every encoder: the norm switch and the ``Backbone`` base class."""

from torch import Tensor, nn

NORMS: tuple[str, ...] = ("bn", "gn", "none")
"""Allowed values of ``model.network.norm``: BatchNorm, GroupNorm (paper 004), no normalisation."""


def check_norm(norm: str) -> str:
    """Return ``norm`` unchanged, or raise ``ValueError`` naming ``model.network.norm``."""
    if norm not in NORMS:
        allowed = ", ".join(repr(n) for n in NORMS)
        raise ValueError(f"model.network.norm: unknown norm {norm!r}; choose one of {allowed}")
    return norm


def group_count(channels: int, max_groups: int = 32) -> int:
    """Largest number of groups ``<= min(max_groups, channels)`` that divides ``channels``."""
    if channels < 1:
        raise ValueError(f"channels must be positive, got {channels}")
    groups = min(max_groups, channels)
    while channels % groups:
        groups -= 1
    return groups


def make_norm(norm: str, channels: int) -> nn.Module:
    """Normalisation layer over ``channels`` feature maps; shape-preserving on (N, C, H, W).

    ``"bn"`` -> ``BatchNorm2d``; ``"gn"`` -> ``GroupNorm`` with ``min(32, channels)`` groups,
    lowered until it divides ``channels``; ``"none"`` -> ``Identity``.
    """
    check_norm(norm)
    if norm == "bn":
        return nn.BatchNorm2d(channels)
    if norm == "gn":
        return nn.GroupNorm(group_count(channels), channels)
    return nn.Identity()


class Backbone(nn.Module):
    """Encoder: images (N, C, H, W) -> features (N, feature_dim).

    Subclasses hold their stages in ``self.stages`` (or override ``feature_maps``, the output of
    each stage in order) and implement ``pool`` (last stage map -> flat features); ``forward``
    is ``pool(feature_maps(x)[-1])``.
    """

    feature_dim: int
    default_norm: str = "bn"
    default_head: tuple[int, ...] = ()
    """Hidden sizes of the classifier head that ``build_classifier`` uses by default."""
    default_head_dropout: float = 0.0
    """Dropout of that default head."""

    def feature_maps(self, x: Tensor) -> list[Tensor]:
        """Stage outputs for ``x`` (N, C, H, W), each (N, C_i, H_i, W_i), in order."""
        maps = []
        stages = self.stages  # every backbone has its ``stages`` (a ModuleList or Sequential)
        assert isinstance(stages, nn.Module)
        for stage in stages.children():
            x = stage(x)
            maps.append(x)
        return maps

    def pool(self, last: Tensor) -> Tensor:
        """Last stage map (N, C_k, H_k, W_k) -> features (N, feature_dim)."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Images (N, C, H, W) -> features (N, feature_dim)."""
        return self.pool(self.feature_maps(x)[-1])


def check_flat_size(name: str, flat: Tensor, feature_dim: int, size: str) -> Tensor:
    """Return ``flat`` (N, D), or raise ``ValueError`` if ``D != feature_dim``."""
    if flat.shape[1] != feature_dim:
        raise ValueError(
            f"{name} expects {size} inputs ({feature_dim} flat features), "
            f"got {flat.shape[1]} flat features"
        )
    return flat
