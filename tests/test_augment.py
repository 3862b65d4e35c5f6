"""The batched views against the per-image reference (torchvision v2, one image at a time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.transforms.v2 import functional as F

from fedlit.data import build_transform, dataset_spec, load_split
from fedlit.data.augment import CUTOUT_SCALE, BatchRandAugment, BatchView

SPEC = dataset_spec("fashion_mnist")


@pytest.fixture(scope="module")
def images(fmnist_root: Path) -> torch.Tensor:
    return load_split("fashion_mnist", fmnist_root, train=False, download=False).images[:2000]


def _per_image(view: str, images: torch.Tensor, spec=SPEC) -> torch.Tensor:
    transform = build_transform(view, spec)
    return torch.stack([transform(x) for x in images])


def test_randaugment_equals_torchvision_per_image_with_the_same_draws(
    images: torch.Tensor,
) -> None:
    ra = BatchRandAugment()
    torch.manual_seed(0)
    codes = torch.arange(28).repeat(2)[torch.randperm(56)].view(28, 2)  # every (op, sign)
    rgb = torch.randint(0, 256, (28, 3, 32, 32), dtype=torch.uint8)
    for batch in (images[:28], rgb):
        out = ra(batch, codes)
        table = ra.magnitudes(*batch.shape[-2:])
        for b in range(len(batch)):
            x = batch[b]
            for code in codes[b].tolist():
                name, magnitude, signed = table[code // 2]
                x = ra.apply_op(x, name, -magnitude if signed and code % 2 else magnitude)
            assert torch.equal(out[b], x), (b, [table[c // 2][0] for c in codes[b].tolist()])


def test_randaugment_equals_torchvision_per_image_on_random_draws(images: torch.Tensor) -> None:
    """Whole batches with their own draws: many images in each pass, mixed signs and slots."""
    ra = BatchRandAugment()
    torch.manual_seed(8)
    rgb = torch.randint(0, 256, (150, 3, 32, 32), dtype=torch.uint8)
    for batch in (images[:300], rgb):
        codes = ra.draw(len(batch))
        out = ra(batch, codes)
        for b in range(len(batch)):
            x = batch[b]
            for code in codes[b].tolist():
                x = ra.apply_op(x, *ra.signed_magnitude(code, *batch.shape[-2:]))
            assert torch.equal(out[b], x), (b, codes[b].tolist())


def test_sharpness_by_integer_box_sums_equals_torchvision() -> None:
    """The rounded 3x3 smoothing from integer sums (k / 13 is never near a half) gives
    torchvision's convolved and rounded one, for both factors, on one and three channels."""
    ra = BatchRandAugment()
    torch.manual_seed(9)
    for channels in (1, 3):
        x = torch.randint(0, 256, (400, channels, 32, 32), dtype=torch.uint8)
        for factor in (0.7, 1.3, 0.0, 2.0):
            weight = torch.full((400, 1, 1, 1), 1.0 - factor)
            assert torch.equal(ra._sharpness(x, weight), F.adjust_sharpness(x, factor))


def test_randaugment_draws_each_op_and_sign_uniformly() -> None:
    ra = BatchRandAugment()
    torch.manual_seed(1)
    codes = ra.draw(140_000)  # (B, 2)
    counts = torch.bincount(codes.flatten() // 2, minlength=14).float()
    expected = codes.numel() / 14
    assert ((counts - expected).abs() / expected).max() < 0.03
    assert abs((codes % 2).float().mean().item() - 0.5) < 0.01


def _crop_offsets(out: torch.Tensor, images: torch.Tensor, pad: int) -> list[tuple]:
    """For each output, the (top, left, flipped) with which it is a crop of its reflect-padded
    input (exactly); fails if there is none."""
    padded = torch.nn.functional.pad(images.float(), (pad,) * 4, mode="reflect")
    size = images.shape[-1]
    found = []
    for b in range(len(out)):
        match = None
        for top in range(2 * pad + 1):
            for left in range(2 * pad + 1):
                crop = padded[b, :, top : top + size, left : left + size]
                for flipped, candidate in ((False, crop), (True, crop.flip(-1))):
                    if match is None and torch.equal(candidate, out[b].float()):
                        match = (top, left, flipped)
        assert match is not None, f"image {b} is no crop of its padded input"
        found.append(match)
    return found


def test_weak_view_is_a_per_image_reflect_padded_crop_and_flip(images: torch.Tensor) -> None:
    """Every image gets its own offset in [0, 2 * pad] and its own coin, as torchvision's
    RandomCrop + RandomHorizontalFlip would draw them image by image."""
    torch.manual_seed(2)
    view = BatchView("weak", SPEC)
    same = images[5:6].repeat(400, 1, 1, 1)  # one image 400 times
    out = view.weak_geometry(same)
    offsets = _crop_offsets(out, same, view.pad)
    tops = torch.tensor([o[0] for o in offsets])
    flips = torch.tensor([o[2] for o in offsets], dtype=torch.float)
    assert tops.min() == 0 and tops.max() == 2 * view.pad  # the whole range is drawn
    assert torch.bincount(tops).min() > 400 / 7 * 0.5  # near-uniform over the 7 offsets
    assert 0.4 < flips.mean() < 0.6
    assert len({tuple(x.flatten().tolist()) for x in out}) > 30  # not one draw per batch


def _stats(views: torch.Tensor, plain: torch.Tensor) -> dict[str, float]:
    changed = (views - plain).abs() > 1e-4
    return {
        "changed": changed.float().mean().item(),
        "mean_abs_change": (views - plain).abs().mean().item(),
        "zero": (views == 0).float().mean().item(),
        "mean": views.mean().item(),
        "std": views.std().item(),
    }


@pytest.mark.parametrize("view", ["weak", "strong"])
def test_batched_views_match_the_per_image_reference_in_distribution(
    images: torch.Tensor, view: str
) -> None:
    """Statistics over 2,000 real images: the fraction of changed pixels, the mean absolute
    change, the erased fraction (exact zeros: only Cutout makes them), the mean and spread."""
    plain = _per_image("plain", images)
    torch.manual_seed(3)
    reference = _stats(_per_image(view, images), plain)
    torch.manual_seed(4)
    batched = _stats(BatchView(view, SPEC)(images), plain)
    torch.manual_seed(5)
    again = _stats(_per_image(view, images), plain)  # the reference's own seed-to-seed noise
    for key in reference:
        noise = abs(reference[key] - again[key])
        tolerance = max(4 * noise, 0.01 * abs(reference[key]), 2e-3)
        assert abs(batched[key] - reference[key]) < tolerance, (key, reference, batched, again)


def test_cutout_erases_one_square_of_the_stated_size(images: torch.Tensor) -> None:
    torch.manual_seed(6)
    x = BatchView("plain", SPEC)(images)
    out = BatchView("strong", SPEC).cutout(torch.ones_like(x))
    erased = out == 0
    area = erased.flatten(1).float().sum(1)
    rows, cols = erased[:, 0].any(2).sum(1), erased[:, 0].any(1).sum(1)
    assert torch.equal(rows, cols) and torch.equal(rows * cols, area.long())  # squares
    low = round((CUTOUT_SCALE[0] * 28 * 28) ** 0.5) ** 2
    high = round((CUTOUT_SCALE[1] * 28 * 28) ** 0.5) ** 2
    assert area.min() >= low and area.max() <= high
    # E[round(sqrt(U * 784))^2] for U ~ U(0.02, 0.25), as torchvision's RandomErasing draws it
    u = torch.linspace(*CUTOUT_SCALE, 100_001)
    expected = ((u * 784).sqrt().round() ** 2).mean()
    assert abs(area.mean() - expected) < 0.03 * expected


def test_same_seed_same_views_and_views_are_per_image(images: torch.Tensor) -> None:
    view = BatchView("strong", SPEC)
    torch.manual_seed(7)
    a = view(images[:64])
    torch.manual_seed(7)
    b = view(images[:64])
    assert torch.equal(a, b)
    same = view(images[:1].repeat(64, 1, 1, 1))
    assert len({tuple(x.flatten().tolist()) for x in same}) == 64


def test_views_on_rgb_keep_shape_and_reject_float() -> None:
    spec = dataset_spec("cifar10")
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    for name in ("plain", "weak", "strong"):
        out = BatchView(name, spec)(x)
        assert out.shape == x.shape and out.dtype == torch.float32
    with pytest.raises(ValueError, match="uint8"):
        BatchView("weak", spec)(x.float())


def test_a_view_shared_by_batches_of_other_sizes_gives_a_new_views_values(
    images: torch.Tensor,
) -> None:
    """One view over batches of changing sizes (its tables prepared once per shape) gives, for
    each batch, what a view built for that batch alone gives on the same seed."""
    shared = BatchView("strong", SPEC)
    for k, size in enumerate((16, 64, 16, 7, 64)):
        torch.manual_seed(k)
        ours = shared(images[:size])
        torch.manual_seed(k)
        assert torch.equal(ours, BatchView("strong", SPEC)(images[:size]))
