#!/usr/bin/env bash
# The lent GPU's figures (issue 31, item 9), in one call of at most ~9.5 minutes:
#   1. the paper-scale FedSEAL round solo (recipes/papers/paper002_fmnist/fedseal.yaml),
#   2. paper 002's Table 1 at seed 0 (recipes/comparisons/paper002_fmnist.yaml: 10 runs,
#      ResNet-18, 200 rounds) side by side with `jobs: 10`, for what is left of the call,
#   with `nvidia-smi` sampling the GPU's utilisation every second throughout.
# The comparison lives in /tmp/cmp on the machine, so the same script, called again while the
# machine is warm, resumes it (SOLO=0 skips part 1). Set-up as ../shared/gpu/README.md says:
# the call carries .whl (lightly, jsonargparse and their needs) and .fmnist (Debian's files).
#   device run: bash benchmarks/gpu_table.sh   (carry [".whl", ".fmnist"], timeout_s 590)
# What comes back in $OUT: gpu.txt, util.csv (time, phase, utilisation %, memory MiB),
# summary.json (per run: rounds done, s/round, last test/acc), solo.log, compare.log, runs.tgz.
set -u
START=$(date +%s)
BUDGET=${BUDGET:-540}            # seconds this call may use in all
SOLO=${SOLO:-1}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=disabled
mkdir -p /usr/share/datasets/fashion-mnist && cp .fmnist/*.gz /usr/share/datasets/fashion-mnist/
python3 -c "from fedlit.data.datasets import stage_debian_fashion_mnist as s; s('data')" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, lightning; print(torch.__version__, lightning.__version__)" >> "$OUT/gpu.txt"
echo solo > /tmp/phase
( while true; do
    echo "$(date +%s),$(cat /tmp/phase),$(nvidia-smi --query-gpu=utilization.gpu,memory.used \
      --format=csv,noheader,nounits | tr -d ' ')"
    sleep 1
  done ) >> "$OUT/util.csv" &
SAMPLER=$!

if [ "$SOLO" = 1 ]; then
  rm -rf /tmp/solo
  timeout 100 python3 -m fedlit fit --config recipes/papers/paper002_fmnist/fedseal.yaml \
    --trainer.default_root_dir /tmp/solo ${EXTRA:-} > "$OUT/solo.log" 2>&1
  echo "solo exit $?" >> "$OUT/solo.log"
fi

echo table > /tmp/phase
LEFT=$(( BUDGET - ($(date +%s) - START) - 25 ))
timeout -s TERM "$LEFT" python3 -m fedlit compare --config recipes/comparisons/paper002_fmnist.yaml \
  --seeds '[0]' --jobs ${JOBS:-10} --out /tmp/cmp --report /tmp/cmp/report.md \
  ${COMPARE_EXTRA:-} >> "$OUT/compare.log" 2>&1
echo "compare exit $? after $(( $(date +%s) - START )) s" >> "$OUT/compare.log"
sleep 3
kill $SAMPLER

python3 - "$OUT" <<'EOF'
import csv, json, sys
from pathlib import Path

out = Path(sys.argv[1])
summary = {}
for metrics in sorted(Path("/tmp").glob("solo/**/metrics.csv")) + sorted(
    Path("/tmp/cmp").glob("*/*/seed*/metrics.csv")
):
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("time/round_s")]
    times = [float(r["time/round_s"]) for r in rows]
    accs = [float(r["test/acc"]) for r in csv.DictReader(open(metrics)) if r.get("test/acc")]
    summary[str(metrics.parent)] = {
        "rounds": len(rows),
        "round_s": times,
        "median_round_s_after_first": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else None,
        "last_test_acc": accs[-1] if accs else None,
    }
util = [line.strip().split(",") for line in open(out / "util.csv") if line.count(",") == 3]
for phase in ("solo", "table"):
    busy = [float(u[2]) for u in util if u[1] == phase and u[2].replace(".", "").isdigit()]
    if busy:
        summary[f"util_{phase}"] = {"samples": len(busy), "mean": sum(busy) / len(busy),
                                    "median": sorted(busy)[len(busy) // 2]}
json.dump(summary, open(out / "summary.json", "w"), indent=1)
print(json.dumps({k: (v if k.startswith("util") else {kk: v[kk] for kk in ("rounds", "median_round_s_after_first", "last_test_acc")}) for k, v in summary.items()}, indent=1))
EOF
tar czf "$OUT/runs.tgz" -C /tmp --exclude='*.ckpt' --exclude='*.pt' cmp solo 2>/dev/null
tail -5 "$OUT/compare.log"
