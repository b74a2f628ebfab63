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
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "no Chromium here (apt-get install chromium): the drawing is $svg, not screenshotted"
  exit 0
fi
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,620 \
  --screenshot="$out/pipeline_p4_m8.png" "file://$PWD/$svg" >/dev/null 2>&1
# A rendered drawing is a PNG of tens of KB; a blank or failed page is a few hundred bytes or none.
size=$(stat -c %s "$out/pipeline_p4_m8.png" 2>/dev/null || echo 0)
if ((size < 10000)); then
  echo "screenshot check FAILED: $out/pipeline_p4_m8.png is $size bytes"
  exit 1
fi
echo "screenshot check OK: $out/pipeline_p4_m8.png ($size bytes) from $browser"
