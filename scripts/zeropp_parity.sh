#!/usr/bin/env bash
# ZeRO++'s parity on this machine: the main job's GPT at stage 3, bf16, on 2 "nodes" of 2 ranks (two
# launchers on localhost, as docs/launcher.md runs several nodes), for STEPS steps with each variant
# of the compressed collectives that exists, and the validation loss of each against the
# unquantized run's. Prints a markdown table; the per-step losses stay in OUT (default a temp dir)
# for a chart.
#   STEPS=1000 bash scripts/zeropp_parity.sh
# Variants: plain stage 3; qwZ int8; qwZ int8 with optimizer and parameter offload; qwZ int4; hpZ
# (nodes of 2) with qwZ; qgZ int8 and int4 alone; all three, and all three offloaded (the case
# DeepSpeed's hpZ + offload broke). The smallest gradient norm of the logged steps is printed beside
# each loss (DeepSpeed's broken runs showed 0).
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
  grep -E "^\[rank 0\] step +[0-9]+ \| loss" "$OUT/$name.node0.log" | awk '{print $3, $6, $9}' >"$OUT/$name.loss"
  echo "$(sed -n 's/.*validation loss \([0-9.]*\).*/\1/p' "$OUT/$name.node0.log" | tail -1)" \
    "$(awk 'NR == 1 || $3 < m {m = $3} END {print m}' "$OUT/$name.loss")"
}

read -r plain plain_norm < <(run plain)
echo "| variant | validation loss at step $STEPS | against plain stage 3 | smallest grad norm |"
echo "| --- | --- | --- | --- |"
echo "| plain stage 3 | $plain | - | $plain_norm |"
all3="--quantized-weights int8 --hpz-size 2 --quantized-gradients int4"
for v in "qwZ int8|--quantized-weights int8" "qwZ int8, offload|--quantized-weights int8 --offload --offload-params" \
         "qwZ int4|--quantized-weights int4" "qwZ int8 + hpZ|--quantized-weights int8 --hpz-size 2" \
         "qgZ int8|--quantized-gradients int8" "qgZ int4|--quantized-gradients int4" \
         "qwZ int8 + hpZ + qgZ int4|$all3" "qwZ int8 + hpZ + qgZ int4, offload|$all3 --offload --offload-params"; do
  IFS='|' read -r name flags <<<"$v"
  # shellcheck disable=SC2086
  read -r loss norm < <(run "$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' '_')" $flags)
  echo "| $name | $loss | $(python3 -c "print(f'{($loss / $plain - 1) * 100:+.2f}%')" 2>/dev/null || echo -) | $norm |"
done
echo "(per-step losses: $OUT/*.loss)" >&2
