"""A recipe's run with one round under ``torch.profiler``: host time, kernel time, launches.

Runs the recipe in this process (its overrides after it, as ``fedlit fit`` takes them), writes
its run as ``fedlit fit`` does (metrics, checkpoints) and profiles round ``--round`` (after the
warm-up rounds, so that a compiled step's compilation is not in it). At that round's end it
writes the profile's summary to ``--out``: the round's wall time, the time the device spent in
kernels (summed over kernels; kernels of other processes are not counted), the kernel launches
the host made (``cudaLaunchKernel`` and its kin) and CUDA graph replays (``cudaGraphLaunch``),
and the ops and kernels that took the most time. The run goes on after it (stop it with
``timeout``; the summary is written already).

    python benchmarks/round_profile.py recipes/papers/paper002_fmnist/fedseal.yaml --round 3 \
        --out profile.txt -- --federation.compile=reduce-overhead --trainer.default_root_dir=/tmp/r
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from fedlit.cli.fit import federation_of, loggers
from fedlit.resolver import resolve
from fedlit.federation.callbacks import Callback, RunView

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


class Recordings:
    """Counts the CUDA graphs torch.compile's graph trees record (``reduce-overhead``): one
    per compiled graph and its first replayable call where the step's static inputs keep
    their memory; a recording every fit means they do not."""

    count = 0
    installed = False

    @classmethod
    def install(cls) -> None:
        """Count from now on (once: a second call changes nothing)."""
        from torch._inductor import cudagraph_trees

        if cls.installed:
            return
        cls.installed = True
        manager = cudagraph_trees.CUDAGraphTreeManager
        original = manager.record_function

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return original(self, *args, **kwargs)

        manager.record_function = counted  # type: ignore[method-assign]


class StageTimes(Callback):
    """Each round's wall time per stage (the device synchronised at every mark): the server
    step, each client, the updates' callbacks and aggregation, the evaluation, and the round's
    end (logging and the checkpoint), with the round's CUDA graph recordings and the frames
    dynamo has compiled so far, one JSON line a round in ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.marks: list[tuple[str, float]] = []
        self.recorded = 0
        Recordings.install()

    def _mark(self, label: str) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.marks.append((label, time.perf_counter()))

    def on_stage(self, run: RunView, round_idx: int, stage: str) -> None:
        self._mark(stage.split(" ")[0] if stage.startswith("client ") else stage)

    def on_updates(self, run: RunView, round_idx: int, *args: Any) -> None:
        self._mark("updates and aggregation")

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        self._mark("round end")
        times: dict[str, float] = {}
        for (label, t), (_, t_next) in zip(self.marks, self.marks[1:], strict=False):
            times[label] = times.get(label, 0.0) + t_next - t
        from torch._dynamo.utils import counters

        line = {
            "round": round_idx,
            "round_s": metrics.get("time/round_s"),
            **times,
            "cuda_graphs_recorded": Recordings.count - self.recorded,
            "frames": counters["stats"]["unique_graphs"],
        }
        self.recorded = Recordings.count
        with self.out.open("a") as f:
            f.write(
                json.dumps({k: v if isinstance(v, int) else round(v, 4) for k, v in line.items()})
                + "\n"
            )
        self.marks = [("checkpoint and logging", time.perf_counter())]


class PythonProfile(Callback):
    """cProfile from the end of round ``first - 1`` to the end of round ``last``: the host's
    time by Python function, written to ``out`` (the most time spent in, and the most
    cumulative)."""

    def __init__(self, first: int, last: int, out: Path) -> None:
        self.first, self.last, self.out = first, last, out
        self.profiler: cProfile.Profile | None = None

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        if round_idx == self.first - 1:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        elif round_idx == self.last and self.profiler is not None:
            self.profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(self.profiler, stream=text)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
            self.out.write_text(text.getvalue())
            self.profiler = None


class ProfileRound(Callback):
    """Profiles round ``round_idx`` (from the end of the round before it to its own end) and
    writes the summary to ``out``."""

    def __init__(self, round_idx: int, out: Path) -> None:
        self.round_idx, self.out = round_idx, out
        self.profiler: Any = None
        self.started = 0.0

    def on_round_end(self, run: RunView, round_idx: int, metrics: dict[str, float]) -> None:
        if round_idx == self.round_idx - 1:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self.started = time.perf_counter()
        elif round_idx == self.round_idx and self.profiler is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.started
            self.profiler.__exit__(None, None, None)
            self.out.write_text(summary(self.profiler, wall, round_idx, metrics))
            self.profiler = None


def summary(prof: Any, wall: float, round_idx: int, metrics: dict[str, float]) -> str:
    events = prof.key_averages()
    kernel_us = sum(
        e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA
    )
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    replays = sum(e.count for e in events if e.key == "cudaGraphLaunch")
    ops = sum(e.count for e in events if e.key.startswith("aten::"))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [
        f"round {round_idx} on {device}",
        f"wall time of the round (profiled): {wall:.3f} s "
        f"(its time/round_s row: {metrics.get('time/round_s', float('nan')):.3f} s)",
        f"kernel time on the device: {kernel_us / 1e6:.3f} s "
        f"({100 * kernel_us / 1e6 / wall:.1f}% of the wall time)",
        f"kernel launches by the host: {launches}",
        f"CUDA graph replays: {replays}",
        f"aten ops dispatched: {ops}",
        f"test/acc after the round: {metrics.get('test/acc', float('nan')):.4f}",
        "",
        events.table(sort_by="self_cpu_time_total", row_limit=25),
    ]
    if torch.cuda.is_available():
        lines.append(events.table(sort_by="self_device_time_total", row_limit=25))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--round", type=int, default=3, help="the round to profile (>= 2)")
    parser.add_argument("--out", type=Path, default=Path("round_profile.txt"))
    parser.add_argument("--stages", type=Path, help="also each round's stage times (JSON lines)")
    parser.add_argument("--no-profile", action="store_true", help="no torch.profiler")
    parser.add_argument("--cprofile", type=Path, help="also cProfile rounds --round to --last")
    parser.add_argument("--last", type=int, help="the last round cProfile covers (--round)")
    args, overrides = parser.parse_known_args()  # the rest: fedlit fit's overrides
    overrides = [a for a in overrides if a != "--"]
    if args.round < 2:
        parser.error("--round must be >= 2 (round 1 compiles and warms up)")
    cli = resolve(["--config", args.recipe, *overrides])
    run_dir = Path(cli.config.trainer.default_root_dir)
    federation = federation_of(
        cli,
        loggers=loggers(cli.config_init.trainer.logger, run_dir),
        extra_callbacks=[
            *([] if args.no_profile else [ProfileRound(args.round, args.out)]),
            *([StageTimes(args.stages)] if args.stages else []),
            *(
                [PythonProfile(args.round, args.last or args.round, args.cprofile)]
                if args.cprofile
                else []
            ),
        ],
    )
    federation.run()  # prepares, locks the run directory, runs, closes


if __name__ == "__main__":
    main()
