"""Each method's whole training step compiled (``federation.compile``) against eager, per method.

For each method a small run of its recipe (the local Fashion-MNIST, 4 clients of 512 images in
batches of 16, 32 steps a client, the small CNN, 4 rounds) is made eager and compiled
(``--mode``, default ``default``), in this process, and the script prints:

- graph breaks (torch._dynamo's counter; the step is compiled with ``fullgraph=True``, so a
  break is an error, and a method that has one says so in the ``error`` column);
- frames compiled after round 2 and after round 4 (torch._dynamo's ``unique_graphs``): one per
  (objective, network) pair of the run, not growing with rounds or clients;
- compile time: round 1's wall time compiled minus eager's (the graphs are built in round 1;
  inductor's on-disk cache, warm after a first run, makes later compilations faster);
- aten ops per client step, rounds 2-4 under torch.profiler, all phases of the round together
  (the clients' and the server's steps, their set-up, aggregation, evaluation), eager and
  compiled, and their ratio ("-" for a method whose clients do not train);
- the median round time of rounds 2-4, eager and compiled, and their ratio.

    python benchmarks/compile_step.py                        # paper 002's Table 1 methods
    python benchmarks/compile_step.py --methods all          # every method's recipe
    python benchmarks/compile_step.py --methods fedseal --clients 8   # more clients
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from fedlit.cli.fit import federation_of
from fedlit.resolver import resolve
from fedlit.data.datasets import stage_debian_fashion_mnist
from fedlit.federation.callbacks import Callback, RunView

STEPS = 32  # client steps a round (batches of 16)
TABLE_1 = ("server_sl", "fedavg_sl", "fedavg_fixmatch", "fedavg_uda", "fedseal")
RECIPES = Path(__file__).parents[1] / "recipes"


def small(root: Path, run_dir: Path, clients: int, rounds: int) -> list[str]:
    """Overrides that shrink a recipe to the small run this script measures."""
    return [
        "--data.dataset=fashion_mnist",
        f"--data.root={root}",
        f"--data.num_clients={clients}",
        f"--data.examples_per_client={16 * STEPS}",
        "--data.client_batch_size=16",
        "--data.batch_size=16",
        "--data.labeled_per_class=5",
        "--data.labeled_fraction=null",
        "--data.val_per_class=2",
        "--data.test_subset=200",
        f"--federation.rounds={rounds}",
        f"--federation.clients_per_round={clients}",
        "--federation.local_epochs=1",
        "--federation.local_steps=null",
        "--federation.server_epochs=1",
        "--federation.eval_epochs=1",
        "--model.init_args.network.backbone=small_cnn",
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        f"--trainer.default_root_dir={run_dir}",
    ]


class Measure(Callback):
    """Frames compiled after each round; rounds 2 to the last under torch.profiler, its aten
    ops counted."""

    def __init__(self) -> None:
        self.frames: dict[int, int] = {}
        self.round_s: dict[int, float] = {}
        self.ops = 0
        self.clients_train = False  # whether the method's clients train (client/* metrics)
        self.profiler: Any = None

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        self.frames[round_idx] = counters["stats"]["unique_graphs"]
        self.clients_train |= any(k.startswith("client/loss") for k in metrics)
        self.round_s[round_idx] = metrics["time/round_s"]
        if round_idx == 1:
            self.profiler = profile(activities=[ProfilerActivity.CPU])
            self.profiler.__enter__()
        elif round_idx == run.config.rounds and self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            events = self.profiler.key_averages()
            self.ops = sum(e.count for e in events if e.key.startswith("aten::"))
            self.profiler = None


def run(method: str, mode: str | None, root: Path, clients: int, rounds: int) -> Measure:
    """A small run of ``method``'s recipe, eager (``mode`` None) or compiled."""
    torch._dynamo.reset()
    counters.clear()
    measure = Measure()
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "--config",
            str(RECIPES / f"{method}.yaml"),
            *small(root, Path(tmp), clients, rounds),
        ]
        if mode is not None:
            args.append(f"--federation.compile={mode}")
        federation = federation_of(
            resolve(args), Path(tmp), progress=False, extra_callbacks=[measure]
        )
        federation.run()  # prepares, locks the run directory, runs, closes
    return measure


def client_steps(method: str, clients: int, rounds: int) -> int:
    """Client steps in rounds 2..rounds (:data:`STEPS` a client, all clients)."""
    return (rounds - 1) * clients * STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(TABLE_1), help="recipe stems, or all")
    parser.add_argument("--mode", default="default", help="federation.compile's mode")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    root = Path(args.root)
    stage_debian_fashion_mnist(root)
    methods = args.methods
    if methods == ["all"]:
        methods = sorted(p.stem for p in RECIPES.glob("*.yaml") if p.stem != "quickstart")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; mode {args.mode}; "
        f"{args.clients} clients x {16 * STEPS} images, small CNN, {args.rounds} rounds"
    )
    head = (
        f"{'method':<22}{'breaks':>7}{'frames r2':>10}{'frames r' + str(args.rounds):>10}"
        f"{'compile s':>10}{'ops/step eager':>15}{'compiled':>9}{'ratio':>7}"
        f"{'round ms eager':>15}{'compiled':>9}{'ratio':>7}"
    )
    print(head)
    for method in methods:
        try:
            eager = run(method, None, root, args.clients, args.rounds)
            compiled = run(method, args.mode, root, args.clients, args.rounds)
        except Exception as err:  # a graph break under fullgraph=True, or another failure
            reason = traceback.format_exception_only(err)[-1].strip().splitlines()[0]
            print(f"{method:<22}error: {reason[:160]}")
            continue
        breaks = sum(counters["graph_break"].values())
        steps = client_steps(method, args.clients, args.rounds)
        later = range(2, args.rounds + 1)
        e_round = statistics.median(eager.round_s[r] for r in later)
        c_round = statistics.median(compiled.round_s[r] for r in later)
        ops = (  # per client step: none where the clients do not train (Server-SL)
            f"{eager.ops / steps:>15.0f}{compiled.ops / steps:>9.0f}"
            f"{compiled.ops / max(eager.ops, 1):>6.2f}x"
            if eager.clients_train
            else f"{'-':>15}{'-':>9}{'-':>7}"
        )
        print(
            f"{method:<22}{breaks:>7}{compiled.frames.get(2, 0):>10}"
            f"{compiled.frames.get(args.rounds, 0):>10}"
            f"{compiled.round_s[1] - eager.round_s[1]:>10.1f}{ops}"
            f"{1000 * e_round:>15.0f}{1000 * c_round:>9.0f}{c_round / e_round:>6.2f}x"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
