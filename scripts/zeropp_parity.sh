#!/usr/bin/env bash
# ZeRO++'s parity on this machine: the main job's GPT at stage 3, bf16, on 2 "nodes" of 2 ranks (two
# launchers on localhost, as docs/launcher.md runs several nodes), for STEPS steps with each variant
# of the compressed collectives that exists, and the validation loss of each against the
# unquantized run's. Prints a markdown table; the per-step losses stay in OUT (default a temp dir)
# for a chart.
#   STEPS=1000 bash scripts/zeropp_parity.sh
# Variants: plain stage 3; qwZ int8; qwZ int8 with optimizer and parameter offload (the case
# DeepSpeed's hpZ + offload broke); qwZ int4.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-1000}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt >&2
B=bazel-out/k8-opt/bin
port=$((29600 + RANDOM % 300))

run() {  # name, then train_gpt's flags
  local name=$1
  shift
  local args=(--stage 3 --dtype bf16 --steps "$STEPS" --val-every "$STEPS" --sample-tokens 0 --log-every 10 --deterministic "$@")
  port=$((port + 1))
  ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export ZERO_JOB_TOKEN  # the two launchers' shared secret (docs/launcher.md)
  for node in 0 1; do
    "$B/comm/launch/zerorun" --nnodes 2 --node-rank "$node" --master-addr 127.0.0.1 --master-port "$port" \
      --nproc-per-node 2 -- "$B/examples/gpt/train_gpt" "${args[@]}" >"$OUT/$name.node$node.log" 2>&1 &
  done
  wait
  grep -E "^\[rank 0\] step +[0-9]+ \| loss" "$OUT/$name.node0.log" | awk '{print $3, $6}' >"$OUT/$name.loss"
  sed -n 's/.*validation loss \([0-9.]*\).*/\1/p' "$OUT/$name.node0.log" | tail -1
}

plain=$(run plain)
echo "| variant | validation loss at step $STEPS | against plain stage 3 |"
echo "| --- | --- | --- |"
echo "| plain stage 3 | $plain | - |"
for v in "qwZ int8|--quantized-weights int8" "qwZ int8, offload|--quantized-weights int8 --offload --offload-params" \
         "qwZ int4|--quantized-weights int4"; do
  IFS='|' read -r name flags <<<"$v"
  # shellcheck disable=SC2086
  loss=$(run "$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' '_')" $flags)
  echo "| $name | $loss | $(python3 -c "print(f'{($loss / $plain - 1) * 100:+.2f}%')" 2>/dev/null || echo -) |"
done
echo "(per-step losses: $OUT/*.loss)" >&2
