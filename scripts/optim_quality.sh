#!/usr/bin/env bash
# The optimizers' quality table of docs/optim.md: the main job's GPT (train_gpt's defaults, the same
# tokens) on 2 local ranks for STEPS steps, each optimizer at three peak learning rates and three
# seeds; prints each optimizer's validation loss at its best rate (mean and spread over the seeds).
#
#   bash scripts/optim_quality.sh [STEPS] [-- extra train_gpt flags]        (STEPS default 1000)
#   OPTIMIZERS="adamw muon adamw8bit" LRS="0.001 0.003 0.01" SEEDS="1 2 3" bash scripts/optim_quality.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
shift $(($# > 0 ? 1 : 0))
[[ ${1:-} == -- ]] && shift
optimizers=(${OPTIMIZERS:-adamw muon})
lrs=(${LRS:-0.001 0.003 0.01})
seeds=(${SEEDS:-1 2 3})
bazel build -c opt --config=native //comm/launch:zerorun //examples/gpt:train_gpt >/dev/null 2>&1
out=$(mktemp -d)
# Copies, so that a later build of another configuration cannot swap bazel-bin under the runs.
mkdir -p "$out/bin"
cp bazel-bin/comm/launch/zerorun bazel-bin/examples/gpt/train_gpt "$out/bin/"
for opt in "${optimizers[@]}"; do
  for lr in "${lrs[@]}"; do
    for seed in "${seeds[@]}"; do
      log="$out/$opt-$lr-$seed"
      "$out/bin/zerorun" --nproc-per-node 2 -- "$out/bin/train_gpt" --optimizer "$opt" --lr "$lr" \
        --seed "$seed" --steps "$steps" --val-every "$steps" --sample-tokens 0 --log-every "$steps" \
        --metrics "$log.jsonl" "$@" >"$log.txt" 2>&1 || { echo "failed: $opt lr $lr seed $seed ($log.txt)"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$out" "$steps" <<'PY'
import glob, json, os, statistics, sys
out, steps = sys.argv[1], sys.argv[2]
runs = {}
for f in glob.glob(os.path.join(out, "*.jsonl")):
    opt, lr, seed = os.path.basename(f)[:-6].rsplit("-", 2)
    val = [json.loads(l)["validation_loss"] for l in open(f) if "validation_loss" in l][-1]
    runs.setdefault(opt, {}).setdefault(float(lr), []).append(val)
print(f"GPT (train_gpt's defaults), 2 ranks, {steps} steps; validation loss, mean over seeds (min-max)")
print(f"{'optimizer':12} {'best lr':>8} {'mean':>8} {'spread':>15}   every lr (mean)")
for opt, by_lr in runs.items():
    best = min(by_lr, key=lambda lr: statistics.mean(by_lr[lr]))
    v = by_lr[best]
    others = "  ".join(f"{lr:g}: {statistics.mean(x):.4f}" for lr, x in sorted(by_lr.items()))
    print(f"{opt:12} {best:>8g} {statistics.mean(v):8.4f} {min(v):7.4f}-{max(v):.4f}   {others}")
PY
