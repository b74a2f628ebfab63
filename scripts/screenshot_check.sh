#!/usr/bin/env bash
# Renders an SVG in headless Chromium and checks that it rendered: a PNG of at least 10 KB (a blank
# or failed page is a few hundred bytes or none). Without Chromium it says so and succeeds.
#
#   bash scripts/screenshot_check.sh FILE.svg OUT.png WIDTH,HEIGHT
set -euo pipefail
svg=$(realpath "$1") png=$2 size=$3
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "no Chromium here (apt-get install chromium): the drawing is $svg, not screenshotted"
  exit 0
fi
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$size" \
  --screenshot="$png" "file://$svg" >/dev/null 2>&1
bytes=$(stat -c %s "$png" 2>/dev/null || echo 0)
if ((bytes < 10000)); then
  echo "screenshot check FAILED: $png is $bytes bytes"
  exit 1
fi
echo "screenshot check OK: $png ($bytes bytes) from $browser"
