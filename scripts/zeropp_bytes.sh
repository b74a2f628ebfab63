#!/usr/bin/env bash
# ZeRO++'s bytes between nodes on this machine: the main job's GPT at stage 3 with bf16 parameters
# and bf16 reduction on 2 "nodes" of 2 ranks (two launchers on localhost, as docs/launcher.md runs
# several nodes), STEPS steps per variant; the bytes every rank sent this step, counted per peer at
# the transport (comm/peer_traffic.h) and printed by train_gpt, read from the last step's line.
# Prints a markdown table with each variant's bytes between nodes against plain stage 3's.
#   bash scripts/zeropp_bytes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-4}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt >&2
B=bazel-out/k8-opt/bin
port=$((29300 + RANDOM % 300))

run() {  # name, then train_gpt's flags; prints "in_node between_nodes" of the last step
  local name=$1
  shift
  local args=(--stage 3 --dtype bf16 --reduce-dtype bf16 --steps "$STEPS" --val-every 0 --sample-tokens 0 --log-every 1
              --metrics "$OUT/$name.jsonl" "$@")
  port=$((port + 1))
  ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export ZERO_JOB_TOKEN  # the two launchers' shared secret (docs/launcher.md)
  for node in 0 1; do
    "$B/comm/launch/zerorun" --nnodes 2 --node-rank "$node" --master-addr 127.0.0.1 --master-port "$port" \
      --nproc-per-node 2 -- "$B/examples/gpt/train_gpt" "${args[@]}" >"$OUT/$name.node$node.log" 2>&1 &
  done
  wait
  python3 -c "
import json, sys
steps = [json.loads(l) for l in open('$OUT/$name.jsonl') if '\"in_node_bytes\"' in l]
print(steps[-1]['in_node_bytes'], steps[-1]['between_nodes_bytes'])"
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
