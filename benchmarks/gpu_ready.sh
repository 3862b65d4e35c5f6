#!/usr/bin/env bash
# Is fedlit ready on this GPU? The first thing to run on a GPU machine (issue 71), in under
# 10 minutes: one line per check, each a short run of the quick-start recipe (2 rounds):
#   eager            precision unset (bf16-mixed on compute capability 8.0+, else 16-mixed)
#   eager_16_mixed   --trainer.precision 16-mixed (fp16 with its gradient scaler)
#   compiled_one     --federation.compile reduce-overhead, each step one call
#   compiled_three   the same, three calls a step (FEDLIT_ONE_CALL=0)
#   local_vs_pool    FedAvg-FixMatch in-process and on a pool of 2 workers, deterministic:
#                    the final weights compared
#   tuned_compare    a tiny tuned comparison (2 trials, then its run) through its report
#                    (needs the optuna extra)
#   gpu_memory       the GPU's memory and utilisation, sampled every second throughout
# On a machine without a CUDA GPU each check prints "no GPU" and the script exits 0.
#   bash benchmarks/gpu_ready.sh                 (from the repository's root)
# Where the run dirs and logs go: $GPU_READY_DIR (default runs/gpu_ready,
# under the repository root, which git ignores); the data: data/.
# On the project's lent machine, set up as ../shared/gpu/README.md says (.whl, .fmnist).
set -u
DIR=${GPU_READY_DIR:-runs/gpu_ready}
PY=${PYTHON:-python3}
CHECKS="eager eager_16_mixed compiled_one compiled_three local_vs_pool tuned_compare gpu_memory"
mkdir -p "$DIR"

WHY=$("$PY" -c "import torch; print('' if torch.cuda.is_available() else
'torch.cuda.is_available() is False')" 2>&1 | tail -1)
if ! command -v nvidia-smi > /dev/null 2>&1 && [ -z "$WHY" ]; then
  WHY="nvidia-smi not found"
fi
if [ -n "$WHY" ]; then
  for check in $CHECKS; do echo "$check: no GPU ($WHY); skipped"; done
  exit 0
fi

if [ -d .whl ] && [ ! -d /tmp/site/lightly ]; then  # the lent machine: no package registry
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if [ -d .fmnist ] && [ ! -d data/fashion_mnist ] && [ ! -d data/FashionMNIST ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp .fmnist/*.gz /usr/share/datasets/fashion-mnist/
  "$PY" -c "from fedlit.data.datasets import stage_debian_fashion_mnist as s; s('data')"
fi

( while true; do
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits | head -1
    sleep 1
  done ) > "$DIR/gpu.csv" 2> /dev/null &
SAMPLER=$!
trap 'kill $SAMPLER 2> /dev/null' EXIT

TINY="--federation.rounds=2"
last_metrics() {  # last_metrics RUN_DIR: the last round's test/acc and its seconds
  "$PY" - "$1" <<'PY'
import csv, sys
from pathlib import Path
found = sorted(Path(sys.argv[1]).glob("**/metrics.csv"))
rows = [r for r in csv.DictReader(open(found[-1]))] if found else []
acc = [r["test/acc"] for r in rows if r.get("test/acc")]
secs = [r["time/round_s"] for r in rows if r.get("time/round_s")]
print(f"test/acc {float(acc[-1]):.4f}" if acc else "no test/acc",
      f"last round {float(secs[-1]):.1f} s" if secs else "")
PY
}
run() {  # run NAME TIMEOUT [fedlit fit overrides]: the quick-start, 2 rounds; one line
  local name=$1 limit=$2 start; shift 2
  start=$(date +%s)
  rm -rf "${DIR:?}/$name"
  timeout "$limit" "$PY" -m fedlit fit --config recipes/quickstart.yaml \
    --trainer.default_root_dir="$DIR/$name" $TINY "$@" > "$DIR/$name.log" 2>&1
  local code=$? took=$(( $(date +%s) - start ))
  if [ $code = 0 ]; then
    echo "$name: ok in $took s, $(last_metrics "$DIR/$name")"
  else
    echo "$name: FAILED (exit $code after $took s; $DIR/$name.log: $(grep -v '^\s*$' \
      "$DIR/$name.log" | tail -1 | cut -c1-200))"
  fi
}

PRECISION=$("$PY" -c "import torch; from fedlit.federation.fit import default_precision as d
print(d(), 'on', torch.cuda.get_device_name(), 'compute capability %d.%d' %
      torch.cuda.get_device_capability())" 2>&1 | tail -1)
echo "gpu: $PRECISION (the default precision)"
run eager 120
run eager_16_mixed 120 --trainer.precision=16-mixed
run compiled_one 180 --federation.compile=reduce-overhead
FEDLIT_ONE_CALL=0 run compiled_three 180 --federation.compile=reduce-overhead

# local against pool: equal weights (deterministic kernels, cuBLAS's fixed workspace)
SAME="--trainer.deterministic=true --trainer.precision=32-true"
start=$(date +%s)
ok=1
for executor in local pool; do
  rm -rf "${DIR:?}/fixmatch_$executor"
  CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 120 "$PY" -m fedlit fit \
    --config recipes/quickstart.yaml $TINY $SAME --federation.executor=$executor \
    --federation.pool.workers=2 --trainer.default_root_dir="$DIR/fixmatch_$executor" \
    > "$DIR/fixmatch_$executor.log" 2>&1 || ok=0
done
if [ $ok = 1 ]; then
  echo "local_vs_pool: $("$PY" - "$DIR" <<'PY'
import sys
from pathlib import Path
import torch
def weights(name):
    path = next(Path(sys.argv[1], name).glob("**/last.ckpt"))
    return torch.load(path, map_location="cpu", weights_only=True)["method_state"]
a, b = weights("fixmatch_local"), weights("fixmatch_pool")
diff = max(((a[k].double() - b[k].double()).abs().max().item() for k in a
            if a[k].is_floating_point()), default=0.0)
same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print(("ok: equal weights" if same else f"DIFFERENT weights (max |diff| {diff:.3g})")
      + f" in {len(a)} tensors")
PY
  ) in $(( $(date +%s) - start )) s"
else
  echo "local_vs_pool: FAILED after $(( $(date +%s) - start )) s (see $DIR/fixmatch_*.log)"
fi

# a tiny tuned comparison, through its report (the tune report scores the chosen trial)
start=$(date +%s)
if ! "$PY" -c "import optuna" > /dev/null 2>&1; then
  echo "tuned_compare: skipped (optuna is not installed: pip install -e '.[tune]')"
else
  rm -rf "${DIR:?}/compare"
  cat > "$DIR/tuned.yaml" <<YAML
name: gpu_ready
out: $DIR/compare
report: $DIR/compare/report.md
recipes: [recipes/server_sl.yaml, recipes/fedavg_fixmatch.yaml]
seeds: [0]
jobs: 2
overrides:
  - --data.num_clients=2
  - --data.examples_per_client=64
  - --data.labeled_per_class=5
  - --data.val_per_class=2
  - --data.test_subset=200
  - --federation.rounds=2
  - --federation.clients_per_round=2
  - --federation.server_epochs=1
  - "--federation.final_eval=[]"
baseline: server_sl
tune: {trials: 2, seeds: [100], sampler_seed: 0}
YAML
  timeout 240 "$PY" -m fedlit compare --config "$DIR/tuned.yaml" > "$DIR/compare.log" 2>&1
  code=$?
  if [ $code = 0 ] && grep -q "### Tuning" "$DIR/compare/report.md" 2> /dev/null; then
    echo "tuned_compare: ok in $(( $(date +%s) - start )) s, report $DIR/compare/report.md"
  else
    echo "tuned_compare: FAILED (exit $code after $(( $(date +%s) - start )) s; \
$DIR/compare.log: $(grep -v '^\s*$' "$DIR/compare.log" | tail -1 | cut -c1-200))"
  fi
fi

kill $SAMPLER 2> /dev/null
echo "gpu_memory: $(awk -F', *' 'NF == 2 && $2 ~ /^[0-9]+$/ {n++; u += $1;
  if ($2 > m) m = $2} END {if (n) printf "peak %d MiB used, utilisation %.0f%% on average \
over %d samples", m, u / n, n; else print "no samples"}' "$DIR/gpu.csv")"
exit 0
