"""A FixMatch client step with the network eager vs ``torch.compile``d, in one process.

What ``federation.compile`` does to a training step: the network (forward and backward) is
compiled, the optimiser and the augmentation stay eager (the views are drawn outside the graph:
here every step reuses batches computed beforehand, so each step has the same fixed shapes, as
CUDA graphs need). For each mode the script measures, from the same initial weights and the
same batches:

- the first compiled step (tracing and code generation) against an eager step;
- the steady-state step time (median of ``--repeats`` runs of ``--steps`` steps, eager and
  compiled taking turns);
- how far the compiled run's losses and final weights are from the eager run's (with every
  image in the loss: threshold 0).

``--federation`` also runs the quick-start-sized tiny federation (FedAvg-FixMatch, two rounds)
eager and compiled and prints both test accuracies.

    python benchmarks/compile_step.py                              # small CNN, CPU
    python benchmarks/compile_step.py --device cuda --backbone resnet18
    python benchmarks/compile_step.py --modes default reduce-overhead --federation
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from fedlit.data import ImageBatches, dataset_spec, load_split
from fedlit.data.datasets import stage_debian_fashion_mnist
from fedlit.data.loaders import expand_batches
from fedlit.models import build_classifier
from fedlit.objectives import FixMatch, FixMatchLoss


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_steps(
    objective: FixMatch, batches: list[tuple[torch.Tensor, torch.Tensor]], device: str
) -> tuple[float, list[float]]:
    """Seconds for one FixMatch step per batch (forward, backward, SGD step) and the losses."""
    optimizer, _ = objective.optimizer_and_scheduler(1)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda"))
    losses = []
    sync(device)
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        with autocast:
            loss = objective.training_step(batch, i)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()  # type: ignore[union-attr]
        losses.append(loss.detach())
    sync(device)
    return time.perf_counter() - t0, [x.item() for x in losses]


def objective_for(network: nn.Module, tau: float = 0.95) -> FixMatch:
    return FixMatch(copy.deepcopy(network), lr=0.003, loss=FixMatchLoss(tau=tau))


def max_difference(a: nn.Module, b: nn.Module) -> float:
    return max(
        (x.float() - y.float()).abs().max().item()
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def measure(args: argparse.Namespace, images: torch.Tensor) -> None:
    dev, bs = args.device, args.batch_size
    spec = dataset_spec("fashion_mnist")
    torch.manual_seed(0)
    loader = ImageBatches(images, spec, ("weak", "strong"), bs, shuffle=True)
    batches = [tuple(x.to(dev) for x in expand_batches(raw)) for raw in loader.on_device()]
    batches = [b for b in batches if len(b[0]) == bs][: args.steps]  # one fixed shape
    torch.manual_seed(0)
    initial = build_classifier(args.backbone, 10, 1).to(dev)
    eager = objective_for(initial)
    run_steps(eager, batches[:2], dev)  # warm-up (allocator, kernels' first use)
    print(f"device {dev}; torch threads {torch.get_num_threads()}; {args.backbone}, batch {bs}")
    print(f"{'mode':<18}{'first step s':>13}{'eager step ms':>15}{'compiled ms':>13}{'ratio':>8}")
    for mode in args.modes:
        torch._dynamo.reset()
        compiled = objective_for(initial)
        compiled.network.compile(mode=mode)
        first, _ = run_steps(compiled, batches[:1], dev)
        one_eager, _ = run_steps(objective_for(initial), batches[:1], dev)
        run_steps(compiled, batches[1:3], dev)  # CUDA graphs record on the first calls
        a, b = [], []
        for _ in range(args.repeats):
            a.append(run_steps(objective_for(initial), batches, dev)[0] / len(batches))
            b.append(run_steps(compiled, batches, dev)[0] / len(batches))
        ea, cb = statistics.median(a), statistics.median(b)
        print(
            f"{mode:<18}{first:>13.1f}{1000 * ea:>15.2f}{1000 * cb:>13.2f}{ea / cb:>7.2f}x"
            f"   (an eager first step: {1000 * one_eager:.1f} ms)"
        )
        # the same steps from the same weights, every image in the loss (tau 0; at 0.95 a new
        # network's loss is masked to 0): how far compiled is from eager
        left, right = objective_for(initial, 0.0), objective_for(initial, 0.0)
        right.network.compile(mode=mode)
        _, eager_losses = run_steps(left, batches, dev)
        _, compiled_losses = run_steps(right, batches, dev)
        loss_gap = max(abs(x - y) for x, y in zip(eager_losses, compiled_losses, strict=True))
        print(
            f"{'':<18}after {len(batches)} steps: losses differ by at most {loss_gap:.2e}, "
            f"weights by {max_difference(left.network, right.network):.2e}"
        )


def federation_accuracy(root: Path, mode: str | None, rounds: int) -> float:
    """Test accuracy of a tiny FedAvg-FixMatch run (the quick-start's protocol, shrunk)."""
    from fedlit.data import FederatedDataModule
    from fedlit.federation import Federation, FederationConfig
    from fedlit.methods import FedAvgFixMatch

    data = FederatedDataModule(
        root=str(root), num_clients=4, examples_per_client=256, test_subset=1000
    )
    config = FederationConfig(rounds=rounds, clients_per_round=4, compile=mode)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as run_dir:
        fed = Federation(
            FedAvgFixMatch(num_classes=10, in_channels=1),
            data,
            config,
            Path(run_dir),
            progress=False,
        )
        result = fed.run()
    return result.history[-1]["test/acc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backbone", default="small_cnn", help="small_cnn or resnet18")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=15, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"])
    parser.add_argument("--federation", action="store_true", help="also a tiny run, both ways")
    parser.add_argument("--rounds", type=int, default=2, help="the tiny run's rounds")
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    root = Path(args.root)
    stage_debian_fashion_mnist(root)
    images = load_split("fashion_mnist", root, train=True, download=True).images[:2000]
    measure(args, images)
    if args.federation:
        for mode in (None, args.modes[0]):
            torch._dynamo.reset()
            t0 = time.perf_counter()
            acc = federation_accuracy(root, mode, args.rounds)
            took = time.perf_counter() - t0
            print(f"tiny federation, compile {mode}: test/acc {acc:.4f} ({took:.0f} s wall)")


if __name__ == "__main__":
    main()
