#!/usr/bin/env bash
# ZeRO++'s bytes between nodes on this machine: the main job's GPT at stage 3 with bf16 parameters
# and bf16 reduction on 2 "nodes" of 2 ranks (two launchers on localhost, as docs/launcher.md runs
# several nodes), STEPS steps per variant; the bytes every rank sent this step, counted per peer at
# the transport (comm/peer_traffic.h) and printed by train_gpt: the step of median bytes between
# nodes after the first (which records the unit order; steps differ by about 1% where a unit stays
# gathered from its forward to its backward in one and not in another).
# Prints a markdown table with each variant's bytes between nodes against plain stage 3's.
#   bash scripts/zeropp_bytes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-7}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt >&2
B=${B:-bazel-out/k8-opt/bin}
# shellcheck source=scripts/two_nodes.sh
source scripts/two_nodes.sh

run() {  # name, then train_gpt's flags; prints "in_node between_nodes" of the median step
  local name=$1
  shift
  run_two_nodes "$name" --stage 3 --dtype bf16 --reduce-dtype bf16 --steps "$STEPS" --val-every 0 --sample-tokens 0 \
    --log-every 1 --metrics "$OUT/$name.jsonl" "$@"
  python3 -c "
import json, sys
steps = [json.loads(l) for l in open('$OUT/$name.jsonl') if '\"in_node_bytes\"' in l]
later = sorted(steps[1:], key=lambda s: s['between_nodes_bytes'])  # the first step records the order
m = later[len(later) // 2]
print(m['in_node_bytes'], m['between_nodes_bytes'])"
}

read -r plain_in plain_between < <(run plain)
echo "| variant | bytes in nodes / step | bytes between nodes / step | between, against plain |"
echo "| --- | ---: | ---: | ---: |"
echo "| plain stage 3 | $plain_in | $plain_between | 1 |"
for v in "qwZ|--quantized-weights int8" "qwZ + hpZ|--quantized-weights int8 --hpz-size 2" \
         "qwZ + hpZ + qgZ int8|--quantized-weights int8 --hpz-size 2 --quantized-gradients int8" \
         "qwZ + hpZ + qgZ int4|--quantized-weights int8 --hpz-size 2 --quantized-gradients int4"; do
  IFS='|' read -r name flags <<<"$v"
  # shellcheck disable=SC2086
  read -r in between < <(run "$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' '_')" $flags)
  echo "| $name | $in | $between | 1/$(python3 -c "print(f'{$plain_between / $between:.2f}')") |"
done
echo "(logs: $OUT)" >&2
