#!/usr/bin/env bash
# Memory per rank of the GPT (4 layers, n_embd 128) on 8 local ranks at (dp, tp, pp) = (8,1,1),
# (4,2,1), (4,1,2), (2,2,2), (1,2,4) and ZeRO stages 1-3: world rank 0's engine categories (peak)
# measured by train_gpt beside zero_plan's plan of the same rank (pipeline stage 0, tp rank 0),
# and their totals. Pipelines run 1F1B over 2 x pp micro-batches. Also a CSV and a stacked bar chart
# (docs/images/layout_memory.svg), screenshotted in headless Chromium where it is installed.
#
#   bash scripts/layout_memory.sh [train_gpt flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt //tools/plan:zero_plan //examples/bench:layout_chart >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
out=${OUT:-/tmp/layout_memory}
mkdir -p "$out"
csv=$out/layout_memory.csv
echo "layout,stage,params,grads,master,optim,buffers,window,planned" >"$csv"
model=(--n-layer 4 --n-embd 128 --n-head 4 --block-size 64)

# "<category> <peak bytes>" per line from a memory table (the peak column: the second size).
peaks() {
  awk '
    function bytes(v, u) { return v * (u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1) }
    /^(\[rank 0\] )?  (params \(shard\)|params \(user\)|grads|master_params|optimizer_state|comm_buffer|gather_window) / {
      sub(/^\[rank 0\] /, "")
      n = split($0, f, /  +/)
      cat = f[2]; split(f[4], p, " ")
      print cat "\t" bytes(p[1], p[2])
    }'
}

printf '%-9s %5s | %-34s | %-34s | %s\n' "dp,tp,pp" "stage" "measured KiB: params grads master optim buf win" \
  "planned KiB" "planned/measured"
for stage in 1 2 3; do
  for layout in "8 1 1" "4 2 1" "4 1 2" "2 2 2" "1 2 4"; do
    read -r dp tp pp <<<"$layout"
    m=$((2 * pp))
    run=$("$bin/comm/launch/zerorun" --nproc-per-node 8 -- "$bin/examples/gpt/train_gpt" "${model[@]}" --steps 2 \
      --val-every 0 --sample-tokens 0 --stage "$stage" --tp "$tp" --pp "$pp" \
      $( ((pp > 1)) && echo --micro-batches $m ) "$@" 2>&1)
    measured=$(echo "$run" | awk '/^\[rank 0\] memory of world rank 0|^\[rank 0\] rank 0 memory/ {on=1} on' | peaks)
    planned=$("$bin/tools/plan/zero_plan" --gpt 4,128,4,256,64 --dtype fp32 --stage "$stage" --world "$dp" \
      --tp "$tp" --pp "$pp" --micro-batches "$m" 2>&1 | peaks)
    bytes_row() {  # the six categories' bytes, comma-separated
      echo "$1" | awk -F'\t' '
        { v[$1] = $2 }
        END {
          split("params (shard)|grads|master_params|optimizer_state|comm_buffer|gather_window", c, "|")
          for (i = 1; i <= 6; i++) printf "%s%.0f", (i > 1 ? "," : ""), v[c[i]] + (i == 1 ? v["params (user)"] : 0)
        }'
    }
    row() {
      echo "$1" | awk -F'\t' '
        { v[$1] = $2 }
        END {
          split("params (shard)|grads|master_params|optimizer_state|comm_buffer|gather_window", c, "|")
          t = 0
          for (i = 1; i <= 6; i++) { x = v[c[i]] + (i == 1 ? v["params (user)"] : 0); t += x; printf "%s%.0f", (i > 1 ? " " : ""), x / 1024 }
          printf " = %.0f", t / 1024
        }'
    }
    mr=$(row "$measured") pr=$(row "$planned")
    mt=${mr##*= } pt=${pr##*= }
    printf '%-9s %5s | %-34s | %-34s | %s\n' "$dp,$tp,$pp" "$stage" "$mr" "$pr" "$(awk -v a="$pt" -v b="$mt" 'BEGIN { printf "%.4f", a / b }')"
    echo "$dp/$tp/$pp,$stage,$(bytes_row "$measured"),$(echo "$(bytes_row "$planned")" | awk -F, '{ t = 0; for (i = 1; i <= NF; i++) t += $i; printf "%.0f", t }')" >>"$csv"
  done
done
svg=docs/images/layout_memory.svg
"$bin/examples/bench/layout_chart" --csv "$csv" --svg "$svg" \
  --title "GPT 4 layers, n_embd 128 on 8 ranks: world rank 0's peak memory (KiB) by (dp/tp/pp) layout and ZeRO stage"
echo "CSV in $csv, chart in $svg"
bash scripts/screenshot_check.sh "$svg" "$out/layout_memory.png" 900,460
