#!/usr/bin/env bash
# The four pipeline schedules for p = 4, m = 8 (interleaved with v = 2) with unit costs: the table
# of step time, bubble and peak in flight, and their timelines side by side in one SVG
# (docs/images/pipeline_p4_m8.svg); then, where Chromium is installed, a screenshot of the drawing
# from the headless browser and a check that it rendered.
#
#   bash scripts/pipeline_timelines.sh [pipeline_schedules flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/pipeline_timelines}
mkdir -p "$out"
bazel build //examples/bench:pipeline_schedules >&2
svg=docs/images/pipeline_p4_m8.svg
"$(bazel info bazel-bin 2>/dev/null)/examples/bench/pipeline_schedules" --p 4 --m 8 --v 2 --svg "$svg" "$@"
bash scripts/screenshot_check.sh "$svg" "$out/pipeline_p4_m8.png" 1000,660
