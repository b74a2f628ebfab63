#!/usr/bin/env bash
# The stage 0/1/2/3 memory and speed benchmark (BENCHMARKS.md): zero_bench at N = 1, 2 and 4 ranks on
# this machine, every configuration measured and planned, into one CSV and one SVG chart; then, where
# Chromium is installed, a screenshot of the chart from the headless browser (and a check that it
# rendered). Flags after the script's name go to zero_bench (e.g. --n-layer 4 for a quicker run).
#
#   bash scripts/zero_bench.sh                      # the 57M-parameter GPT, the 8 configurations
#   OUT=/tmp/zb WORLDS="1 2" bash scripts/zero_bench.sh --n-layer 2
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/zero_bench}
mkdir -p "$out"
rm -f "$out/zero_bench.csv" "$out/zero_bench.txt"
flags=(-c opt --config=native)
bazel build "${flags[@]}" //examples/bench:zero_bench //examples/bench:bench_chart //comm/launch:zerorun
bin=$(bazel info "${flags[@]}" bazel-bin 2>/dev/null)
for n in ${WORLDS:-1 2 4}; do
  "$bin/comm/launch/zerorun" --nproc-per-node "$n" -- "$bin/examples/bench/zero_bench" --batch 4 \
    --csv "$out/zero_bench.csv" --check 0.02 "$@" | tee -a "$out/zero_bench.txt"
done
"$bin/examples/bench/bench_chart" --csv "$out/zero_bench.csv" --svg "$out/zero_bench.svg"
bash scripts/screenshot_check.sh "$out/zero_bench.svg" "$out/zero_bench.png" 1100,900
