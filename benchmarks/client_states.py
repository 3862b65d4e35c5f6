"""Client state at scale: the driver's cost of keeping every client's persistent state.

For FedCon (each client keeps its projector) and FedSEAL (each client keeps its self-ensemble,
and every client updates it every round) with 1,000 and 10,000 clients, runs a few rounds of
only what the driver does with client states, with states of the real shapes (the small CNN's
FedCon projector; FedSEAL's (n_k, classes) mean and count), two ways, each in a fresh process:

* ``whole``: every state in the driver's memory, all of them saved in the checkpoint each
  round (fedlit before the per-client store);
* ``store``: :class:`~fedlit.federation.ClientStateStore`, one file per client state written
  when it changes, the checkpoint holding only the manifest.

Every client holds a state before the measured rounds (a run long enough for each to have
taken part). Prints, per round (median over the rounds): bytes written, seconds spent writing
states and the checkpoint, and the process's peak memory above what it held after start-up.
Training is not run (it costs the same both ways).

    python benchmarks/client_states.py                      # 1,000 and 10,000 clients
    python benchmarks/client_states.py --clients 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedlit.federation import ClientStateStore, save_checkpoint
from fedlit.methods.fedcon import fedcon_projector
from fedlit.models import build_classifier


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _state(method: str, examples: int, generator: torch.Generator) -> dict[str, Any]:
    if method == "fedcon":
        feature_dim = build_classifier("small_cnn", 10, 1, None).backbone.feature_dim
        projector = fedcon_projector(feature_dim).state_dict()
        return {
            "projector": {
                k: torch.randn(v.shape, generator=generator) for k, v in projector.items()
            }
        }
    return {"mean": torch.rand(examples, 10, generator=generator), "count": 3}


def one_run(
    method: str, way: str, clients: int, rounds: int, per_round: int, examples: int
) -> dict[str, float]:
    """In this process: ``rounds`` rounds of ``way``'s client-state handling."""
    generator = torch.Generator().manual_seed(0)
    base = _peak_mb()
    written, seconds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoints" / "last.ckpt"
        ckpt.parent.mkdir(parents=True)
        memory: dict[int, Any] = {}
        store = ClientStateStore(ckpt.parent / "clients")
        # a run that has gone on long enough for every client to hold a state
        for cid in range(clients):
            if way == "store":
                store.put(cid, _state(method, examples, generator))
            else:
                memory[cid] = _state(method, examples, generator)
        store.checkpointed()
        for round_idx in range(1, rounds + 1):
            touched = (
                range(clients)
                if method == "fedseal"
                else [(round_idx * per_round + k) % clients for k in range(per_round)]
            )
            states = [(cid, _state(method, examples, generator)) for cid in touched]
            t0 = time.perf_counter()
            store.begin_round(round_idx)
            for cid, state in states:  # what the driver does as each client's update comes back
                if way == "store":
                    store.put(cid, state)
                else:
                    memory[cid] = state
            payload = {
                "round": round_idx,
                "client_states": store.state_dict() if way == "store" else memory,
            }
            save_checkpoint(ckpt, payload)
            size = ckpt.stat().st_size + (store.bytes_written if way == "store" else 0)
            store.checkpointed()
            seconds.append(time.perf_counter() - t0)
            written.append(size)
            del states
    return {
        "bytes_per_round": statistics.median(written),
        "seconds_per_round": statistics.median(seconds),
        "peak_mb_above_start": _peak_mb() - base,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=10, help="FedCon clients per round")
    parser.add_argument("--examples", type=int, default=1200, help="FedSEAL examples per client")
    parser.add_argument(
        "--one", nargs=3, metavar=("METHOD", "WAY", "CLIENTS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        method, way, clients = args.one
        print(
            json.dumps(
                one_run(method, way, int(clients), args.rounds, args.per_round, args.examples)
            )
        )
        return
    header = ("method", "clients", "way", "MB written/round", "s/round", "peak MB")
    print("{:8} {:>7} {:6} {:>17} {:>8} {:>8}".format(*header))
    for method in ("fedcon", "fedseal"):
        for clients in args.clients:
            for way in ("whole", "store"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--rounds",
                    str(args.rounds),
                    "--per-round",
                    str(args.per_round),
                    "--examples",
                    str(args.examples),
                    "--one",
                    method,
                    way,
                    str(clients),
                ]
                out = json.loads(
                    subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                )
                print(
                    f"{method:8} {clients:7d} {way:6} {out['bytes_per_round'] / 1e6:17.2f} "
                    f"{out['seconds_per_round']:8.2f} {out['peak_mb_above_start']:8.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
