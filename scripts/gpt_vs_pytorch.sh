#!/usr/bin/env bash
# The GPT example at stages 0-3 on 2 ranks next to PyTorch (Debian's python3-torch, DDP over Gloo)
# training the same model on the same number of ranks and threads (one per rank), in one run. Model:
# n_embd 384, 6 layers, 6 heads, context 128, vocabulary 256 (about 10.8M parameters); global batch 8
# sequences. Prints the median step time (the first step left out) and tokens/s of each.
#   bash scripts/gpt_vs_pytorch.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-6}"
py=/usr/bin/python3  # Debian's, where python3-torch installs
"$py" -c "import torch" 2>/dev/null || { echo "needs python3-torch and libopenblas0-pthread (apt-get install)"; exit 1; }
bazel build -c opt --config=native //comm/launch:zerorun //examples/gpt:train_gpt >/dev/null 2>&1
model=(--n-embd 384 --n-layer 6 --n-head 6 --block-size 128 --batch 8 --steps "$steps" --val-every 0
       --sample-tokens 0 --warmup 1 --lr 3e-4)
for stage in 0 1 2 3; do
  out=$(bazel-bin/comm/launch/zerorun --nproc-per-node 2 -- bazel-bin/examples/gpt/train_gpt --stage "$stage" "${model[@]}" 2>&1)
  params=$(grep -o '([0-9]* [a-z0-9]* parameters)' <<<"$out" | head -1 | tr -d '()')
  # Step times in ms, the first left out; the median.
  ms=$(grep -o '| *[0-9.]* ms' <<<"$out" | grep -o '[0-9.]*' | tail -n +2 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  awk -v s="$stage" -v p="$params" -v ms="$ms" 'BEGIN {printf "ours stage %s: %s, step %.1f ms, %.0f tokens/s\n", s, p, ms, 8 * 128 / (ms / 1000)}'
done
# Debian's torch calls whatever libblas.so.3 the alternatives point at: the reference BLAS unless an
# optimized one is installed (setup: apt-get install libopenblas0-pthread). One thread per rank.
echo "pytorch BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu)"
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$py" scripts/gpt_vs_pytorch.py --steps "$steps"
