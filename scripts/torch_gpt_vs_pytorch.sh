#!/usr/bin/env bash
# The LibTorch GPT (examples/libtorch/train_torch_gpt: TorchPipeline, the engine in place of
# torch::optim) on 4 ranks at (dp, tp, pp) = (4,1,1) stages 1 and 3 and (2,2,1) stage 1, next to the
# same model in PyTorch (Debian's python3-torch, scripts/torch_gpt_vs_pytorch.py) with DDP over Gloo
# and torch.optim.AdamW, and with DDP plus ZeroRedundancyOptimizer: the same initial values (the
# first loss shows it), the same batches, AdamW lr 1e-3, weight decay 0.01, clipping at 1; one
# thread per rank everywhere. Model: vocabulary 512, context 64, 4 blocks of width 256, 8 heads, the
# head tied to the token embedding; global batch 16. Prints a table: the median step (the first
# left out; the best of REPS runs taken in turns, since a shared machine's load comes and goes) and
# the largest rank's peak RSS (ours: also the engine's tracked bytes at the end, largest rank).
#   bash scripts/torch_gpt_vs_pytorch.sh [STEPS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
reps="${2:-3}"
py=/usr/bin/python3  # Debian's, where python3-torch installs
"$py" -c "import torch" 2>/dev/null || { echo "needs python3-torch (apt-get install python3-torch)"; exit 1; }
[[ -f /usr/include/torch/csrc/api/include/torch/torch.h ]] || { echo "needs libtorch-dev (apt-get install libtorch-dev)"; exit 1; }
bazel build --config=libtorch //comm/launch:zerorun //examples/libtorch:train_torch_gpt >/dev/null 2>&1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
model=(--vocab 512 --block-size 64 --layers 4 --heads 8 --embd 256 --batch 16 --steps "$steps" --lr 1e-3
       --weight-decay 0.01)

declare -A best rss engine loss
keep() {  # name, step ms, peak rss, engine bytes, first loss
  if [[ -z "${best[$1]:-}" ]] || awk -v a="$2" -v b="${best[$1]}" 'BEGIN {exit !(a < b)}'; then
    best[$1]=$2
    rss[$1]=$3
    engine[$1]=$4
  fi
  loss[$1]=$5
}
median_step() {  # the "step N/M ... X ms" lines, the first left out
  grep -o 'step *[0-9]*/[0-9]* .* [0-9.]* ms' | awk 'NR > 1 {print $(NF - 1)}' | sort -g |
    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}

rows=("ours (4,1,1) stage 1" "ours (4,1,1) stage 3" "ours (2,2,1) stage 1" "PyTorch DDP" "PyTorch DDP + ZeroRedundancyOptimizer")
declare -A flags=(["ours (4,1,1) stage 1"]="--stage 1" ["ours (4,1,1) stage 3"]="--stage 3"
                  ["ours (2,2,1) stage 1"]="--tp 2 --stage 1")
for ((rep = 0; rep < reps; ++rep)); do
  for r in "${rows[@]:0:3}"; do
    # shellcheck disable=SC2086
    out=$(bazel-bin/comm/launch/zerorun --nproc-per-node 4 -- bazel-bin/examples/libtorch/train_torch_gpt \
            "${model[@]}" --micro-batches 1 --log-every "$steps" ${flags[$r]} 2>&1)
    mem=$(grep -o 'memory at step [0-9]* | engine [0-9.]* [KMG]iB (peak [0-9.]* [KMG]iB) | rss [0-9.]* [KMG]iB (peak [0-9.]* [KMG]iB)' <<<"$out" | tail -1)
    keep "$r" "$(median_step <<<"$out")" "$(awk -F'peak ' '{print $3}' <<<"$mem" | tr -d ')')" \
         "$(awk '{print $7, $8}' <<<"$mem")" "$(grep -o 'step    1/[0-9]*  loss [0-9.]*' <<<"$out" | awk '{print $4}')"
  done
  for optimizer in adamw zero; do
    out=$("$py" scripts/torch_gpt_vs_pytorch.py --optimizer "$optimizer" "${model[@]}" 2>&1)
    name="PyTorch DDP"
    [[ $optimizer == zero ]] && name="PyTorch DDP + ZeroRedundancyOptimizer"
    keep "$name" "$(grep -o 'median step [0-9.]*' <<<"$out" | awk '{print $3}')" \
         "$(grep -o 'peak rss [0-9.]* MiB' <<<"$out" | awk '{print $3, $4}')" "-" \
         "$(grep -o 'first loss [0-9.]*' <<<"$out" | awk '{print $3}')"
    params=$(grep -o '[0-9]* parameters' <<<"$out")
  done
done

echo "LibTorch $("$py" -c 'import torch; print(torch.__version__)'), 4 ranks x 1 thread, Gloo, ${params}, batch 16, $steps steps, best of $reps"
ddp=${best["PyTorch DDP"]}
printf '| %-38s | %8s | %7s | %14s | %13s | %-10s |\n' run "step ms" "vs DDP" "peak rss/rank" "engine/rank" "first loss"
printf '| %-38s | %8s | %7s | %14s | %13s | %-10s |\n' --- ---: ---: ---: ---: ---
for r in "${rows[@]}"; do
  printf '| %-38s | %8.1f | %6.2fx | %14s | %13s | %-10s |\n' "$r" "${best[$r]}" \
    "$(awk -v s="${best[$r]}" -v d="$ddp" 'BEGIN {print s / d}')" "${rss[$r]}" "${engine[$r]}" "${loss[$r]}"
done
