"""The host cost of one training step's call, at near-zero arithmetic: a client's step of
paper 002's FedSEAL protocol (batches of 64 Fashion-MNIST images, a weak and a strong view)
on the near-free network of ``host_round.py``, alternated in one process at one thread.

Per step, medians (and means) over ``--steps`` steps after ``--warmup``, in ``--repeats``
rounds that alternate the measurements (so that the machine's load falls on each alike):

- the views' draws, eager: :meth:`~fedlit.data.loaders.RawBatch.draw` (every view's random
  parameters from torch's global CPU generator, packed and moved in one transfer);
- the views' draws, compiled: the same from the fit's
  :class:`~fedlit.data.augment.FitDraws` (a chunk of steps drawn at once, each step its
  slice; the chunk's draw counted in the step that makes it);
- the step's plain call: the objective's eager ``step`` on the drawn batch (its views
  computed), ``backward`` and the optimiser's step;
- the compiled step's calls: the same with the whole step compiled
  (:func:`~fedlit.federation.fit.compiled.compiled_step`, ``torch.compile`` in ``--mode``), then
  ``backward`` and a fused optimiser's step (a compiled fit in a Trainer, and every compiled
  fit before the one-call step);
- the compiled step as one call: the step, its backward and the optimiser's update in one
  graph (:class:`~fedlit.federation.fit.compiled.OneCallStep`, a compiled lean fit's step).

At near-zero arithmetic each is what the host pays for a step, whatever the device.

    OMP_NUM_THREADS=1 python benchmarks/step_call.py --root data
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from host_round import federation, normalise_only

from fedlit.data.augment import BatchView
from fedlit.data.loaders import draw_batches, expand_batches
from fedlit.federation.fit.compiled import one_call_step, whole_step_compiled
from fedlit.federation.fit.loop import on_device
from fedlit.objectives import FitState, Objective


def per_step(work: Callable[[], object], steps: int, warmup: int) -> tuple[float, float]:
    """The median and the mean seconds of ``work`` over ``steps`` calls, after ``warmup`` (the
    mean counts a cost paid once in many calls, as a chunk's draw)."""
    for _ in range(warmup):
        work()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), statistics.fmean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="data")
    parser.add_argument("--mode", default="default", help="torch.compile's mode")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    BatchView.apply = normalise_only  # type: ignore[method-assign]
    settings = argparse.Namespace(rounds=1, compile=None, examples=256, root=args.root)
    with tempfile.TemporaryDirectory() as tmp:
        fed = federation(settings, Path(tmp) / "run")
        fed.method.on_round_start(1, 1)
        side = fed.method.client_side()
        side.on_round_start(1, 1)
        client = fed.data.client_data(0)
        objective: Objective = side.objective(fed.method.broadcast(), client, None)
        objective.fit_state = FitState(1, kept_optimizers=side.kept_optimizers)
        raw = next(iter(on_device(objective, side.loader(client), torch.device("cpu"))))
        objective.before_fit()
        optimizer, _ = objective.optimizer_and_scheduler(1)
        drawn = draw_batches(raw)

        def plain() -> None:
            loss, _ = objective.step(expand_batches(drawn))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        with whole_step_compiled(objective, args.mode) as fields:
            objective.fit_state = FitState(1, kept_optimizers=side.kept_optimizers, **fields)
            fused, _ = objective.optimizer_and_scheduler(1)
            one_call = one_call_step(objective, fused, None)
            assert one_call is not None

            def compiled() -> None:
                step = objective.fit_state.compiled_step
                assert step is not None
                loss, _ = step(objective, drawn)
                fused.zero_grad()
                loss.backward()
                fused.step()

            fit_draws = objective.fit_state.draws
            work = {
                "views' draws, eager (each step's own)": lambda: draw_batches(raw),
                "views' draws, compiled (the fit's, a chunk of steps at once)": lambda: (
                    draw_batches(raw, fit_draws)
                ),
                "the step's plain call": plain,
                "the compiled step's calls (step, backward, optimiser)": compiled,
                "the compiled step as one call": lambda: one_call(drawn),
            }
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in work}
            for _ in range(args.repeats):  # alternated, so that the machine's load is shared
                for name, call in work.items():
                    results[name].append(per_step(call, args.steps, args.warmup))
    print(
        f"host cost per step (median of {args.steps} steps, one thread, near-free network; "
        f"{args.repeats} alternated repeats):"
    )
    for name, both in results.items():
        medians = [m for m, _ in both]
        each = ", ".join(f"{t * 1e3:.3f}" for t in medians)
        mean = statistics.median(a for _, a in both)
        median = statistics.median(medians)
        print(f"  {name}: {median * 1e3:.3f} ms ({each}; mean {mean * 1e3:.3f})")
    three = [m for m, _ in results["the compiled step's calls (step, backward, optimiser)"]]
    one = [m for m, _ in results["the compiled step as one call"]]
    ratios = [a / b for a, b in zip(one, three, strict=True)]
    print(f"  one call / the compiled step's calls: {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
