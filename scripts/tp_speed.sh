#!/usr/bin/env bash
# Step time and tokens/s of the GPT example under data and tensor parallelism: (dp, tp) = (2, 1)
# and (1, 2) on 2 ranks, (2, 2) on 4 ranks (and --sequence-parallel beside each tp > 1), the same
# global batch and model for every row. Prints one line per layout: the median step time and
# tokens/s over the steps after the first 5, and the last step's loss.
#
#   bash scripts/tp_speed.sh [train_gpt flags...]      e.g. --n-embd 256 --n-layer 4 --stage 2
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
steps=${STEPS:-25}
common=(--steps "$steps" --log-every 1 --val-every 0 --sample-tokens 0 --n-embd 128 --n-layer 4 --n-head 8
        --block-size 64 --batch 16 --stage 2 "$@")

row() {  # ranks, tp, sp(0/1)
  local n=$1 tp=$2 sp=$3 extra=()
  [[ $sp == 1 ]] && extra=(--sequence-parallel)
  "$bin/comm/launch/zerorun" --nproc-per-node "$n" -- "$bin/examples/gpt/train_gpt" "${common[@]}" --tp "$tp" \
      "${extra[@]}" 2>&1 |
    awk -v n="$n" -v tp="$tp" -v sp="$sp" '
      /\] step +[0-9]+ \| loss/ {
        split($0, f, "|"); k++
        loss = f[2]; sub(/.*loss /, "", loss)
        tok = f[5]; sub(/ *tok\/s.*/, "", tok)
        ms = f[6]; sub(/ *ms.*/, "", ms)
        if (k > 5) { t[++m] = tok + 0; d[m] = ms + 0 }
      }
      function median(a, m,    i, j, x) {
        for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
        return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
      }
      END { printf "%5d %4d %4d %4s %10.1f %10.0f %9.4f\n", n, n / tp, tp, sp ? "on" : "off", median(d, m), median(t, m), loss }'
}

printf "%5s %4s %4s %4s %10s %10s %9s\n" ranks dp tp sp "ms/step" "tok/s" "loss"
row 2 1 0
row 2 2 0
row 2 2 1
row 4 2 0
row 4 2 1
