#!/usr/bin/env bash
# The GPT through a 2-stage pipeline on 2 local ranks: every schedule at m = 4, 8, 16 measured beside
# the simulator's prediction from the measured costs (examples/bench/pipeline_bench.cc), and the
# measured and simulated timelines at m = 8 in docs/images/pipeline_measured_p2_m8.svg, screenshotted
# in headless Chromium where it is installed. NPROC=4 runs p = 4 (4 ranks then share the cores:
# reported, not asserted).
#
#   bash scripts/pipeline_bench.sh [pipeline_bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=${NPROC:-2}
out=${OUT:-/tmp/pipeline_bench}
mkdir -p "$out"
bazel build -c opt //examples/bench:pipeline_bench //comm/launch:zerorun >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
svg=docs/images/pipeline_measured_p${nproc}_m8.svg
"$bin/comm/launch/zerorun" --nproc-per-node "$nproc" -- "$bin/examples/bench/pipeline_bench" --svg "$svg" "$@"
bash scripts/screenshot_check.sh "$svg" "$out/pipeline_measured_p${nproc}_m8.png" 1000,1400
