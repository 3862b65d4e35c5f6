"""Every recipe, two tiny rounds through the CLI at one thread: its metrics rows and final
weights, recorded to compare two versions of the code (a refactor must not change them).

    OMP_NUM_THREADS=1 python benchmarks/recipe_equality.py record before.json
    ...change the code...
    OMP_NUM_THREADS=1 python benchmarks/recipe_equality.py record after.json
    python benchmarks/recipe_equality.py compare before.json after.json

``record`` runs each recipe of ``recipes/`` (not the comparison specs) with the overrides of
``tests/test_cli.py``'s ``tiny`` (the local Fashion-MNIST, two clients of 32 images, the small
CNN for all but two ResNet recipes) and ``--federation.rounds=2``, each in a process of its own
with one thread. It keeps every logged row of ``metrics.csv`` except the timings (``time/*``)
and the bytes written to disk (``state/bytes_written``, which follows the checkpoint's format),
and a SHA-256 of each tensor of the final checkpoint's method state. ``compare`` prints each
recipe whose rows or weights differ, and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).parents[1]
#: metrics that are not the run's results: wall-clock timings and on-disk sizes
NOT_RESULTS = ("time/", "state/bytes_written")


def _tests_cli() -> Any:
    spec = importlib.util.spec_from_file_location("_recipe_tiny", ROOT / "tests" / "test_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        {k: v for k, v in row.items() if not k.startswith(NOT_RESULTS) and v != ""} for row in rows
    ]


def _weights(run_dir: Path) -> dict[str, str]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = ckpt["method_state"]
    return {
        k: hashlib.sha256(v.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    }


def record(out: Path, only: Sequence[str]) -> None:
    tests_cli = _tests_cli()
    from fedlit.data.datasets import stage_debian_fashion_mnist

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        if not stage_debian_fashion_mnist(data):
            sys.exit("Fashion-MNIST not found: apt-get install dataset-fashion-mnist")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        recipes = [r for r in tests_cli.RECIPES if not only or r.name in only]
        for i, recipe in enumerate(recipes, 1):
            name = str(recipe.relative_to(ROOT))
            run_dir = Path(tmp) / "runs" / name.replace("/", "__")
            args = tests_cli.two_tiny_rounds(data, run_dir, recipe)
            start = time.perf_counter()
            proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
            took = time.perf_counter() - start
            if proc.returncode != 0:
                result[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
            else:
                result[name] = {"rows": _rows(run_dir), "weights": _weights(run_dir)}
            status = "ok" if proc.returncode == 0 else f"FAILED ({proc.returncode})"
            print(f"[{i}/{len(recipes)}] {name}: {status} in {took:.1f} s", flush=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(out)


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    same = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {before if name in a else after}")
            continue
        x, y = a[name], b[name]
        what = [k for k in ("error", "rows", "weights") if x.get(k) != y.get(k)]
        if what:
            print(f"{name}: {', '.join(what)} differ")
        else:
            same += 1
    failed = sum(1 for v in b.values() if "error" in v)
    print(f"{same} of {len(set(a) | set(b))} recipes identical; {failed} failed in {after}")
    return 1 if same < len(set(a) | set(b)) or failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run every recipe and write its rows and weights")
    rec.add_argument("out", type=Path)
    rec.add_argument("--only", nargs="*", default=[], help="recipe file names to run")
    cmp = sub.add_parser("compare", help="the recipes whose rows or weights differ")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.only)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
