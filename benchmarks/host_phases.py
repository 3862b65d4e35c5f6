"""Where ``host_round.py``'s gap goes: each phase of fedlit's round timed against the plain
floor's (:mod:`plain_floor`) side by side in one process, on the same protocol (paper 002's
FedSEAL round, near-free network, views cut to their normalisation).

After one round of each, the phases alternate, each timed over ``--calls`` calls, ``--repeats``
times; printed: each phase's median CPU milliseconds a call (min beside it), fedlit's and the
plain floor's, and what the difference comes to a round (a client's fit 10 times):

- a client's fit: fedlit's client runner (its objective built, fitted, uploaded) against the
  plain floor's client (its network loaded, its sets, its epoch, its upload);
- the server's step: fedlit's (the server objective fitted, eq 5's thresholds measured)
  against the plain floor's epochs, BatchNorm re-estimation and validation predictions;
- the evaluation: fedlit's (validation and test) against the plain floor's two passes;
- fedlit's checkpoint of a round with 10 client states, and its row (the plain floor keeps
  none).

    OMP_NUM_THREADS=1 python benchmarks/host_phases.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedlit.data.augment import BatchView
from host_round import federation, normalise_only
from plain_floor import PlainFloor


def cpu_ms(call: Callable[[], object], calls: int) -> float:
    """This process's CPU milliseconds a call of ``call`` (after one untimed call)."""
    call()
    start = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timings of each phase")
    parser.add_argument("--calls", type=int, default=10, help="calls a timing")
    parser.add_argument("--root", default="data")
    args = parser.parse_args()
    BatchView.apply = normalise_only  # type: ignore[method-assign]
    settings = argparse.Namespace(root=args.root, rounds=8, compile=None, examples=None)
    with tempfile.TemporaryDirectory() as tmp:
        fed = federation(settings, Path(tmp) / "fedlit")
        fed.open_run_dir()
        fed.callbacks.run_start()
        fed.callbacks.first_row({"round": 0, **fed.server.bootstrap()})
        plain = PlainFloor(fed)
        fed.run_and_record_round(1)
        plain.round(1)
        g = torch.Generator().manual_seed(0)
        payload = fed.method.client_payload(fed.method.broadcast(), 0)
        store = fed.round_context.store
        state = store.get(0)

        def checkpoint() -> None:
            for cid in range(10):
                store.put(cid, state)
            fed.callbacks.round_end(2, {"round": 2.0})

        def plain_server() -> None:
            plain.server(plain.server_lr, g)
            plain.recalibrate()
            plain.probabilities(plain.network, plain.val[0])

        phases: dict[str, tuple[Callable[[], object], Callable[[], object] | None, int]] = {
            "a client's fit": (
                lambda: fed.runner(payload, 0, 2, state),
                lambda: plain.client(0, plain.lr, 0.5, g),
                10,
            ),
            "the server's step": (lambda: fed.server.server_step(2), plain_server, 1),
            "the evaluation": (
                fed.server.evaluate,
                lambda: (plain.accuracy(*plain.val), plain.accuracy(*plain.test)),
                1,
            ),
            "the checkpoint, 10 client files, the row": (checkpoint, None, 1),
        }
        times: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in phases}
        for _ in range(args.repeats):
            for phase, (ours, theirs, _) in phases.items():
                times[phase][0].append(cpu_ms(ours, args.calls))
                if theirs is not None:
                    times[phase][1].append(cpu_ms(theirs, args.calls))
        fed.close()
    print(f"CPU ms a call, median of {args.repeats} (min): fedlit, plain floor; a round's gap")
    for phase, (fedlit_ms, floor_ms) in times.items():
        plain_ms = statistics.median(floor_ms) if floor_ms else 0.0
        gap = (statistics.median(fedlit_ms) - plain_ms) * phases[phase][2]
        floor = f"{plain_ms:6.2f} ({min(floor_ms):.2f})" if floor_ms else "     -"
        print(f"  {phase:42s} {statistics.median(fedlit_ms):6.2f} ({min(fedlit_ms):.2f})  "
              f"{floor}  {gap:+6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
