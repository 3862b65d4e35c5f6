"""A fit's views' draws (:class:`~fedlit.data.augment.FitDraws`): seeded from the run,
independent per batch shape, with the distributions of the per-batch draws on torch's global
generator (what a batch drawn outside fedlit's loop takes: a Trainer's, a test's)."""

from __future__ import annotations

import pytest
import torch

from fedlit.data import ImageBatches, dataset_spec
from fedlit.data.augment import CUTOUT_SCALE, BatchView, FitDraws, batch_view
from fedlit.data.loaders import DrawnBatch, RawBatch, draw_batches, expand_batches
from fedlit.federation.fit import compiled, loop
from fedlit.federation.fit import TrainerTemplate
from fedlit.models import build_classifier
from fedlit.objectives import FitState, SupervisedCE

SPEC = dataset_spec("fashion_mnist")
CPU = torch.device("cpu")


def _views(*names: str, spec=SPEC) -> tuple[BatchView, ...]:
    return tuple(batch_view(name, spec) for name in names)


def _steps(fit: FitDraws, views: tuple[BatchView, ...], steps: int, b: int = 16) -> torch.Tensor:
    return torch.stack([torch.cat(fit.draw(views, b, 28, 28, CPU)) for _ in range(steps)])


def _fit(seed: int, chunk: int = 64) -> FitDraws:
    torch.manual_seed(seed)
    return FitDraws(chunk)


def test_same_seed_same_draws_whatever_the_chunk_and_one_global_draw() -> None:
    """The same global seed gives the same steps, for any chunk length (a shape's steps are
    its generator's uniforms in order); another seed other steps. Made, it takes one draw
    from the global generator; drawing takes none."""
    views = _views("weak", "strong")
    steps = _steps(_fit(3), views, 150)
    assert steps.shape == (150, 11, 16) and steps.dtype == torch.int64
    for chunk in (1, 7, 150, 200):
        assert torch.equal(_steps(_fit(3, chunk), views, 150), steps), chunk
    assert not torch.equal(_steps(_fit(4), views, 150), steps)

    fit = _fit(3)
    after_made = torch.get_rng_state()
    _steps(fit, views, 70)  # two chunks
    assert torch.equal(torch.get_rng_state(), after_made)
    torch.manual_seed(3)
    torch.randint(2**62, ())
    assert torch.equal(torch.get_rng_state(), after_made)
    with pytest.raises(ValueError, match="chunk"):
        FitDraws(0)


def test_each_batch_shape_draws_from_its_own_generator() -> None:
    """Two loaders of one fit (a CombinedLoader's labeled and unlabeled batches) do not change
    each other's draws: a shape's steps are the same whether or not another shape draws
    between them (the seeds follow the order of the shapes' first batches)."""
    weak, both = _views("weak"), _views("weak", "strong")
    alone = _steps(_fit(5), weak, 100)
    fit = _fit(5)
    mixed = []
    for k in range(100):
        mixed.append(torch.cat(fit.draw(weak, 16, 28, 28, CPU)))
        fit.draw(both, 16, 28, 28, CPU)
        if k % 3 == 0:
            fit.draw(weak, 8, 28, 28, CPU)  # another batch size: another shape
    assert torch.equal(torch.stack(mixed), alone)


def _histogram_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation between the value histograms of two int64 samples."""
    size = int(max(a.max(), b.max())) + 1
    p = torch.bincount(a.flatten(), minlength=size) / a.numel()
    q = torch.bincount(b.flatten(), minlength=size) / b.numel()
    return 0.5 * (p - q).abs().sum().item()


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10", "mnist"])
def test_fit_draws_have_the_eager_draws_ranges_and_distributions(name: str) -> None:
    """Over 64,000 images per row: every row within its range (the crop's offsets in
    [0, 2 * pad], flips only where they keep the label, codes over the 14 ops and both signs,
    Cutout's side round(sqrt(s h w)) for s in CUTOUT_SCALE and its square inside the image),
    each op and sign at its frequency, and each row's histogram within 0.03 (total
    variation) of the eager draws' (:meth:`BatchView.draw`; about 0.005 apart for samples
    of one distribution)."""
    spec = dataset_spec(name)
    view = BatchView("strong", spec)
    size, pad, b = spec.size, spec.size // 8, 1000
    torch.manual_seed(0)
    fit = FitDraws()
    new = torch.cat([fit.draw((view,), b, size, size, CPU)[0] for _ in range(64)], 1)
    torch.manual_seed(1)
    eager = torch.cat([view.draw(b, size, size) for _ in range(64)], 1)
    rows = dict(zip(BatchView.STRONG_ROWS, new, strict=True))
    for offset in (rows["top"], rows["left"]):
        assert offset.min() == 0 and offset.max() == 2 * pad
    if spec.hflip:
        assert abs(rows["flip"].float().mean().item() - 0.5) < 0.01
    else:
        assert not rows["flip"].any()
    codes = torch.cat([rows["op0"], rows["op1"]])
    assert codes.min() == 0 and codes.max() == 27
    counts = torch.bincount(codes // 2, minlength=14).float()
    assert ((counts - codes.numel() / 14).abs() / (codes.numel() / 14)).max() < 0.04
    assert abs((codes % 2).float().mean().item() - 0.5) < 0.01
    side = rows["side"]
    low, high = (round((s * size * size) ** 0.5) for s in CUTOUT_SCALE)
    assert side.min() == low and side.max() == high
    for start in (rows["cut_top"], rows["cut_left"]):
        assert start.min() == 0 and (start + side).max() == size
        assert (start + side <= size).all()
    for k, row in enumerate(BatchView.STRONG_ROWS):
        assert _histogram_distance(new[k], eager[k]) < 0.03, row


def test_eager_draws_are_unchanged_on_the_global_generator() -> None:
    """Without fit draws a batch draws as before: each view's :meth:`BatchView.draw` on the
    global generator, view after view, and the expanded views are :meth:`RawBatch.expand`'s,
    bit for bit."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (16, 1, 28, 28), dtype=torch.uint8)
    raw = RawBatch(images, ("plain", "weak", "strong"), SPEC, labels=torch.arange(16))
    torch.manual_seed(4)
    drawn = draw_batches([raw])[0]
    torch.manual_seed(4)
    expected = [view.draw(16, 28, 28) for view in _views(*raw.views)]
    assert all(torch.equal(a, e) for a, e in zip(drawn.draws, expected, strict=True))

    torch.manual_seed(5)
    views = expand_batches(raw)
    torch.manual_seed(5)
    assert all(torch.equal(a, e) for a, e in zip(views, raw.expand(), strict=True))


def test_a_fit_through_the_loader_takes_the_fit_draws_step_by_step() -> None:
    """A loader's batches through the hook, with fit draws set: compiled (views in the step)
    each DrawnBatch carries the fit's next draws, split per view; eager (the equality test's
    setting) the views are computed from the same draws."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    loader = ImageBatches(images, SPEC, ("weak", "strong"), 16, shuffle=True)
    views = _views("weak", "strong")
    expected = _steps(_fit(9), views, 8)
    cpu = torch.device("cpu")
    hook = FitState(draws=_fit(9), compiled_step=lambda objective, batch: batch)
    computed = FitState(draws=_fit(9))
    steps = [raw for _ in range(2) for raw in loader.on_device()]
    for k, raw in enumerate(steps):
        drawn = loop.views(raw, cpu, hook)
        assert isinstance(drawn, DrawnBatch)
        assert torch.equal(torch.cat(drawn.draws), expected[k]), k
        assert [len(d) for d in drawn.draws] == [3, 8]
        got = loop.views(raw, cpu, computed)
        assert all(torch.equal(a, e) for a, e in zip(got, drawn.expand(), strict=True))


@pytest.mark.parametrize("compile_mode", [None, "default"])
def test_every_fit_has_draws_of_its_own(
    compile_mode: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fedlit's loop gives each fit, eager or compiled, new fit draws, their chunk the fit's
    planned steps (here 2 of 64), and drops them after the fit."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")  # torch's graphs, no C++ to build
    seen: list[FitDraws | None] = []
    compiled_fits: list[bool] = []

    class Recording(SupervisedCE):
        def before_fit(self) -> None:
            seen.append(self.fit_state.draws)
            compiled_fits.append(self.fit_state.compiled_step is not None)

    torch.manual_seed(0)
    objective = Recording(build_classifier("small_cnn", 10, 1), lr=0.1)
    images = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    labels = torch.zeros(8, dtype=torch.long)
    loader = ImageBatches(images, SPEC, ("weak",), 4, True, labels=labels)
    template = TrainerTemplate(accelerator="cpu", precision="32-true", compile=compile_mode)
    for _ in range(2):
        template.fit(objective, loader, 1)
        assert objective.fit_state.draws is None
    assert all(isinstance(d, FitDraws) for d in seen) and seen[0] is not seen[1]
    assert [d.chunk for d in seen if d is not None] == [2, 2]
    assert compiled_fits == [compile_mode is not None] * 2


def _draws_call_by_call(view: BatchView, b: int, h: int, w: int) -> torch.Tensor:
    """The eager draws as defined: one call of torch's global generator per row (crop's top
    and left, the flip's coin, RandAugment's ops and signs, Cutout's area and position)."""
    pad = view.pad
    top, left = torch.randint(0, 2 * pad + 1, (b,)), torch.randint(0, 2 * pad + 1, (b,))
    flip = (torch.rand(b) < 0.5).long() if view.spec.hflip else torch.zeros(b, dtype=torch.long)
    rows = [top, left, flip]
    if view.view == "strong":
        ops = torch.randint(len(view.randaugment.names), (b, 2))
        signs = torch.randint(2, (b, 2))
        rows += list((2 * ops + signs).T)
        side = (torch.empty(b).uniform_(*CUTOUT_SCALE) * (h * w)).sqrt().round().long()
        rows += [(torch.rand(b) * (h - side + 1)).long(), (torch.rand(b) * (w - side + 1)).long()]
        rows.insert(len(rows) - 2, side)
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10"])
@pytest.mark.parametrize("b", [1, 5, 64])
def test_eager_draws_are_their_call_by_call_definition(name: str, b: int) -> None:
    """A view's eager draws take rows of one distribution in one call (the CPU generator
    fills a tensor element by element): the values of one call per row, bit for bit, for
    the weak and the strong view, with and without the flip."""
    spec = dataset_spec(name)
    for view in _views("weak", "strong", spec=spec):
        torch.manual_seed(b)
        drawn = view.draw(b, spec.size, spec.size)
        torch.manual_seed(b)
        assert torch.equal(drawn, _draws_call_by_call(view, b, spec.size, spec.size))
