#!/usr/bin/env bash
# First run benchmarks/gpu_ready.sh on the machine (one line per check, under 10 minutes;
# docs/executors.md, "Is fedlit ready on this GPU?"): this script assumes what it checks.
# Paper 002 at its own scale on one lent GPU, every training step compiled (issue 44), in calls
# of at most ~9.5 minutes that chain on a warm machine:
#   0. with PROFILE_S > 0: a compiled run whose round 3 runs under torch.profiler (the summary
#      of host time, kernel time, launches and CUDA graph replays: profile_round3.txt);
#   1. solo (SOLO=1): paper 002's FedSEAL round alone, compiled (federation.compile=$MODE:
#      one call a step; where that run fails, once more with FEDLIT_ONE_CALL=0, three calls a
#      step, and the headline with them) then eager, each for a fixed time, with each round's
#      stage times and round 3 under
#      cProfile (benchmarks/round_profile.py; its torch.profiler summary of a round took longer
#      than the round itself to write at this scale, so it is left out here); then, each for a
#      fixed time, the round eager in 16-mixed (FP16_S), on a pool of 4 workers (POOL_S) and on
#      Ray with a quarter GPU a client (RAY_S, where Ray is installed);
#   2. the headline: Server-SL and FedSEAL, IID, ResNet-18, the paper's 200 rounds, seeds 0-2
#      (recipes/comparisons/paper002_fmnist.yaml's runs), side by side with `jobs` $JOBS,
#      compiled, for what is left of the call.
# nvidia-smi samples the GPU's utilisation every second throughout. The comparison lives in
# /tmp/cmp on the machine, so the same script called again while the machine is warm (SOLO=0)
# resumes it. Set-up on a machine without a package registry: the call carries .whl (wheels of
# lightly, jsonargparse, docstring-parser, typeshed-client, hydra-core, omegaconf and
# antlr4-python3-runtime, installed into /tmp/site) and .fmnist (Debian's Fashion-MNIST .gz).
#   device run: SOLO=1 COMPILED_S=120 BUDGET=560 bash benchmarks/gpu_paper002.sh
#               (carry [".whl", ".fmnist"], timeout_s 590: the round alone, then the headline)
#   device run: SOLO=0 BUDGET=... bash benchmarks/gpu_paper002.sh   (the next call)
# What comes back in $OUT: summary.json (per run: rounds done, s/round, last test/acc;
# utilisation per phase) and results.tgz: gpu.txt, util.csv (time, phase, utilisation %,
# memory MiB),
# stages_*.jsonl, cprofile_*.txt, solo_*.log, compare.log, report.md, runs.tgz (the
# runs' metrics and configs, no checkpoints).
set -u
START=$(date +%s)
BUDGET=${BUDGET:-560}            # seconds this call may use in all
SOLO=${SOLO:-1}
MODE=${MODE:-reduce-overhead}    # federation.compile for the compiled runs
JOBS=${JOBS:-6}
EAGER_S=${EAGER_S:-50}           # seconds of the eager solo run (0: none)
FP16_S=${FP16_S:-40}             # seconds of the eager 16-mixed solo run (0: none)
POOL_S=${POOL_S:-40}             # seconds of the eager solo run on 4 pool workers (0: none)
RAY_S=${RAY_S:-40}               # seconds of the eager solo run on Ray, where installed (0: none)
COMPILED_S=${COMPILED_S:-110}    # seconds of the compiled solo run (its compilation included)
PROFILE_S=${PROFILE_S:-0}        # seconds for a run whose round 3 is under torch.profiler (0: none)
FINAL=${OUT:-/tmp/gpu_out}        # what comes back: summary.json and results.tgz
OUT=/tmp/gpu_work                # everything else, packed into results.tgz at the end
RECIPE=recipes/papers/paper002_fmnist/fedseal.yaml
mkdir -p "$OUT" "$FINAL"
if [ ! -d /tmp/site/lightly ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if [ ! -f data/FashionMNIST/raw/t10k-labels-idx1-ubyte ] && [ ! -d data/fashion_mnist ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp .fmnist/*.gz /usr/share/datasets/fashion-mnist/
  python3 -c "from fedlit.data.datasets import stage_debian_fashion_mnist as s; s('data')" || exit 1
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, lightning; print(torch.__version__, lightning.__version__)"; } >> "$OUT/gpu.txt"
echo setup > /tmp/phase
( while true; do
    echo "$(date +%s),$(cat /tmp/phase),$(nvidia-smi --query-gpu=utilization.gpu,memory.used \
      --format=csv,noheader,nounits | tr -d ' ')"
    sleep 1
  done ) >> "$OUT/util.csv" &
SAMPLER=$!

solo() {  # solo NAME SECONDS [overrides]: the paper's FedSEAL alone, stage times per round
  local name=$1 seconds=$2; shift 2
  echo "solo_$name" > /tmp/phase
  rm -rf "/tmp/solo_$name"
  timeout "$seconds" python3 benchmarks/round_profile.py "$RECIPE" --round 3 --last 3 \
    --no-profile --cprofile "$OUT/cprofile_$name.txt" --stages "$OUT/stages_$name.jsonl" \
    -- --trainer.default_root_dir "/tmp/solo_$name" "$@" > "$OUT/solo_$name.log" 2>&1
  echo "exit $?" >> "$OUT/solo_$name.log"
}
if [ "$PROFILE_S" -gt 0 ]; then  # round 3 under torch.profiler: host, kernel time, launches
  echo profile > /tmp/phase
  rm -rf /tmp/solo_profile
  timeout "$PROFILE_S" python3 benchmarks/round_profile.py "$RECIPE" --round 3 \
    --out "$OUT/profile_round3.txt" -- --trainer.default_root_dir /tmp/solo_profile \
    --federation.compile "$MODE" > "$OUT/solo_profile.log" 2>&1
  echo "exit $?" >> "$OUT/solo_profile.log"
fi
failed() {  # failed NAME: the solo run NAME ended with an error (not done, not timed out)
  ! grep -q "^exit \(0\|124\)$" "$OUT/solo_$1.log"
}
if [ "$SOLO" = 1 ]; then
  TORCH_LOGS=perf_hints solo compiled "$COMPILED_S" --federation.compile "$MODE"
  # a compiled run that failed: once more with three calls a step (FEDLIT_ONE_CALL=0: the
  # compiled step, backward, the fused optimiser, as on 2026-11-27), and the headline with them
  if failed compiled; then
    export FEDLIT_ONE_CALL=0
    echo "one call a step failed: three calls (FEDLIT_ONE_CALL=0)" >> "$OUT/gpu.txt"
    TORCH_LOGS=perf_hints solo compiled3 "$COMPILED_S" --federation.compile "$MODE"
    if failed compiled3; then MODE=none; fi  # no compiled headline
  fi
  if [ "$EAGER_S" -gt 0 ]; then solo eager "$EAGER_S"; fi  # EAGER_S=0: no eager run
  if [ "$FP16_S" -gt 0 ]; then solo fp16 "$FP16_S" --trainer.precision 16-mixed; fi
  if [ "$POOL_S" -gt 0 ]; then
    solo pool "$POOL_S" --federation.executor pool --federation.pool.workers 4
  fi
  if [ "$RAY_S" -gt 0 ] && python3 -c "import ray" 2> /dev/null; then
    solo ray "$RAY_S" --federation.executor ray --federation.ray.gpus 0.25
  fi
fi
echo "headline mode: $MODE" >> "$OUT/gpu.txt"

echo headline > /tmp/phase
LEFT=$(( BUDGET - ($(date +%s) - START) - 30 ))
if [ "$LEFT" -gt 30 ] && [ "$MODE" != none ]; then
  timeout -s TERM "$LEFT" python3 -m fedlit compare --config recipes/comparisons/paper002_fmnist.yaml \
    --recipes '[recipes/papers/paper002_fmnist/server_sl.yaml, recipes/papers/paper002_fmnist/fedseal.yaml]' \
    --settings '{iid: []}' --seeds '[0, 1, 2]' --jobs "$JOBS" \
    --overrides "[--federation.compile=$MODE]" \
    --out /tmp/cmp --report /tmp/cmp/report.md >> "$OUT/compare.log" 2>&1
  echo "compare exit $? after $(( $(date +%s) - START )) s" >> "$OUT/compare.log"
fi
sleep 2
kill $SAMPLER

python3 - "$OUT" <<'PY'
import csv, json, sys
from pathlib import Path

out = Path(sys.argv[1])
summary = {}
runs = sorted(Path("/tmp").glob("solo_*/**/metrics.csv")) + sorted(
    Path("/tmp/cmp").glob("**/metrics.csv"))
for metrics in runs:
    rows = list(csv.DictReader(open(metrics)))
    times = [float(r["time/round_s"]) for r in rows if r.get("time/round_s")]
    accs = [float(r["test/acc"]) for r in rows if r.get("test/acc")]
    later = sorted(times[1:])
    summary[str(metrics.parent)] = {
        "rounds": len(times),
        "round_s": [round(t, 3) for t in times],
        "median_round_s_after_first": later[len(later) // 2] if later else None,
        "last_test_acc": accs[-1] if accs else None,
    }
util = [line.strip().split(",") for line in open(out / "util.csv") if line.count(",") == 3]
for phase in sorted({u[1] for u in util}):
    busy = [float(u[2]) for u in util if u[1] == phase and u[2].replace(".", "").isdigit()]
    if busy:
        summary[f"util_{phase}"] = {"samples": len(busy), "mean": sum(busy) / len(busy),
                                    "median": sorted(busy)[len(busy) // 2]}
json.dump(summary, open(out / "summary.json", "w"), indent=1)
for key, value in summary.items():
    if key.startswith("util"):
        print(key, value)
    else:
        print(key, {k: value[k] for k in ("rounds", "median_round_s_after_first", "last_test_acc")})
PY
cp /tmp/cmp/report.md "$OUT/report.md" 2>/dev/null
cp "$OUT/summary.json" "$FINAL/"
tar czf "$FINAL/results.tgz" -C /tmp --exclude='*.ckpt' --exclude='*.pt' --exclude='clients' \
  gpu_work cmp solo_eager solo_fp16 solo_pool solo_ray solo_compiled solo_compiled3 solo_profile \
  2>/dev/null
grep -h "exit" "$OUT"/solo_*.log "$OUT/compare.log" 2>/dev/null
tail -3 "$OUT/compare.log" 2>/dev/null
cat "$OUT"/stages_*.jsonl 2>/dev/null
