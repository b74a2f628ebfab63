#!/usr/bin/env bash
# The LibTorch example (examples/libtorch: a torch::nn residual MLP, LibTorch autograd, the engine in
# place of torch::optim) at stages 0-3 on 2 ranks next to PyTorch (Debian's python3-torch) training the
# same model from the same initial values on the same batches with DDP over Gloo, with
# torch.optim.AdamW and with ZeroRedundancyOptimizer; one thread per rank everywhere
# (torch.set_num_threads(1), one BLAS thread); the engine's buckets 16 MiB, DDP's 25 MB (its default). Model: 256 inputs, width 512, 4 blocks of
# 512 -> 2048 -> 512, 16 classes (8.5M parameters); global batch 64; AdamW lr 1e-3, weight decay 0.01.
# Prints a table of median step times (the first step of each run left out; the best of REPS runs,
# taken in turns, since a shared machine's load comes and goes) and their split: forward, backward, and
# the time outside them (communication still pending, the optimizer, the parameters' all-gather or
# broadcast). The first-step loss shows the runs start from the same model.
#   bash scripts/libtorch_vs_pytorch.sh [STEPS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
reps="${2:-3}"
py=/usr/bin/python3  # Debian's, where python3-torch installs; a python3 earlier on PATH may lack it
"$py" -c "import torch" 2>/dev/null || { echo "needs python3-torch (apt-get install python3-torch)"; exit 1; }
[[ -f /usr/include/torch/csrc/api/include/torch/torch.h ]] || { echo "needs libtorch-dev (apt-get install libtorch-dev)"; exit 1; }
bazel build -c opt --config=libtorch //comm/launch:zerorun //examples/libtorch:train_torch >/dev/null 2>&1
# Debian's torch calls whatever libblas.so.3 the alternatives point at; one thread of it per rank.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
model=(--inputs 256 --hidden 512 --ff 2048 --blocks 4 --classes 16 --batch 64 --steps "$steps" --lr 1e-3
       --weight-decay 0.01)
# The engine's gradient buckets: 16 MiB (DDP's default bucket is 25 MB).
ours=(--bucket-kib 16384)

# "median step S ms (forward F, backward B, outside forward/backward R" -> "S F B R"
split() { grep -o 'median step [0-9.]* ms (forward [0-9.]*, backward [0-9.]*, outside forward/backward [0-9.]*' |
          tr -d ',' | awk '{print $3, $6, $8, $11}'; }

declare -A best loss
keep() {  # name, "S F B R", first loss
  local name=$1 times=$2
  loss[$name]=$3
  if [[ -z "${best[$name]:-}" ]] || awk -v a="$times" -v b="${best[$name]}" 'BEGIN {split(a, x); split(b, y); exit !(x[1] < y[1])}'; then
    best[$name]=$times
  fi
}

rows=("ours stage 0" "ours stage 1" "ours stage 2" "ours stage 3" "pytorch DDP" "pytorch ZeroRedundancyOptimizer")
for ((rep = 0; rep < reps; ++rep)); do
  for stage in 0 1 2 3; do
    out=$(bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/libtorch/train_torch --stage "$stage" "${model[@]}" "${ours[@]}" 2>&1)
    params=$(grep -o '[0-9]* parameters' <<<"$out" | head -1)
    keep "ours stage $stage" "$(split <<<"$out")" "$(grep -o 'step   1  loss [0-9.e+-]*' <<<"$out" | awk '{print $4}')"
  done
  for optimizer in adamw zero; do
    out=$("$py" scripts/libtorch_vs_pytorch.py --optimizer "$optimizer" --steps "$steps" 2>&1)
    name="pytorch DDP"
    [[ $optimizer == zero ]] && name="pytorch ZeroRedundancyOptimizer"
    keep "$name" "$(split <<<"$out")" "$(grep -o 'first loss [0-9.e+-]*' <<<"$out" | awk '{print $3}')"
  done
done

echo "LibTorch $("$py" -c 'import torch; print(torch.__version__)'), 2 ranks x 1 thread, Gloo, ${params}, batch 64, $steps steps, best of $reps"
echo "pytorch BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu)"
ddp=$(awk '{print $1}' <<<"${best["pytorch DDP"]}")
printf '| %-31s | %9s | %9s | %9s | %9s | %8s | %-15s |\n' run "step ms" forward backward outside "vs DDP" "first loss"
printf '| %-31s | %9s | %9s | %9s | %9s | %8s | %-15s |\n' --- ---: ---: ---: ---: ---: ---
for r in "${rows[@]}"; do
  read -r s f b o <<<"${best[$r]}"
  printf '| %-31s | %9.1f | %9.1f | %9.1f | %9.1f | %7.2fx | %-15s |\n' "$r" "$s" "$f" "$b" "$o" "$(awk -v s="$s" -v d="$ddp" 'BEGIN {print s / d}')" "${loss[$r]}"
done
