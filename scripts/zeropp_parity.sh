#!/usr/bin/env bash
# ZeRO++'s parity on this machine: the main job's GPT at stage 3, bf16, on 2 "nodes" of 2 ranks (two
# launchers on localhost, as docs/launcher.md runs several nodes), for STEPS steps with each variant
# of the compressed collectives that exists, and the validation loss of each against the
# unquantized run's. Prints a markdown table; the per-step losses stay in OUT (default a temp dir)
# for a chart.
#   STEPS=1000 bash scripts/zeropp_parity.sh
#   SEEDS="1 2 3" STEPS=1000 bash scripts/zeropp_parity.sh   (each variant at each seed: the mean, and
#                                                             the spread of the seeds' differences)
#   ONLY="qwZ int8|qgZ int8" bash scripts/zeropp_parity.sh -- --n-embd 128
#                      (the variants whose names match the pattern, beside plain; the flags after --
#                       go to every run, plain's included: a larger model here)
# Variants: plain stage 3; qwZ int8; qwZ int8 with optimizer and parameter offload; qwZ int4; hpZ
# (nodes of 2) with qwZ; qgZ int8 and int4 alone, rounded to nearest and stochastically; all three
# (also with stochastic qgZ), and all three offloaded (the case DeepSpeed's hpZ + offload broke). The smallest gradient norm of the logged steps is printed beside
# each loss (DeepSpeed's broken runs showed 0).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-1000}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bazel build -c opt //comm/launch:zerorun //examples/gpt:train_gpt >&2
B=${B:-bazel-out/k8-opt/bin}  # or a copy of them, so that the tree can be rebuilt during a long run
# shellcheck source=scripts/two_nodes.sh
source scripts/two_nodes.sh
SEEDS=${SEEDS:-1}
ONLY=${ONLY:-}
[[ ${1:-} == -- ]] && shift
model=("$@")

run() {  # name, then train_gpt's flags; prints the validation loss and the smallest gradient norm
  local name=$1
  shift
  local args=(--stage 3 --dtype bf16 --steps "$STEPS" --val-every "$STEPS" --sample-tokens 0 --log-every 10 --deterministic "${model[@]}" "$@")
  run_two_nodes "$name" "${args[@]}"
  grep -E "^\[rank 0\] step +[0-9]+ \| loss" "$OUT/$name.node0.log" | awk '{print $4, $7, $10}' >"$OUT/$name.loss"
  echo "$(sed -n 's/.*validation loss \([0-9.]*\).*/\1/p' "$OUT/$name.node0.log" | tail -1)" \
    "$(awk 'NR == 1 || $3 < m {m = $3} END {print m}' "$OUT/$name.loss")"
}

seeded() {  # name, then flags: every seed's "loss norm" on one line each
  local name=$1 seed
  shift
  for seed in $SEEDS; do run "$name.seed$seed" --seed "$seed" "$@"; done
}
# The seeds' mean loss and smallest norm; against plain's, the mean and range of the per-seed
# differences.
summarize() {  # this variant's lines, plain's lines
  python3 - "$1" "$2" <<'PY'
import sys
v = [tuple(map(float, l.split())) for l in sys.argv[1].strip().splitlines()]
p = [tuple(map(float, l.split())) for l in sys.argv[2].strip().splitlines()]
mean = sum(x[0] for x in v) / len(v)
d = [(a[0] / b[0] - 1) * 100 for a, b in zip(v, p)]
spread = f" ({min(d):+.2f}% to {max(d):+.2f}%)" if len(d) > 1 else ""
print(f"{mean:.4f} | {sum(d) / len(d):+.2f}%{spread} | {min(x[1] for x in v)}")
PY
}
plain_runs=$(seeded plain)
echo "| variant | validation loss at step $STEPS (mean of seeds $SEEDS) | against plain stage 3 | smallest grad norm |"
echo "| --- | --- | --- | --- |"
echo "| plain stage 3 | $(summarize "$plain_runs" "$plain_runs" | sed 's/ | +0.00%[^|]*|/ | - |/') |"
all3="--quantized-weights int8 --hpz-size 2 --quantized-gradients int4"
for v in "qwZ int8|--quantized-weights int8" "qwZ int8, offload|--quantized-weights int8 --offload --offload-params" \
         "qwZ int4|--quantized-weights int4" "qwZ int8 + hpZ|--quantized-weights int8 --hpz-size 2" \
         "qgZ int8|--quantized-gradients int8" "qgZ int4|--quantized-gradients int4" \
         "qgZ int8, stochastic|--quantized-gradients int8 --quantized-gradients-stochastic" \
         "qgZ int4, stochastic|--quantized-gradients int4 --quantized-gradients-stochastic" \
         "qwZ int8 + hpZ + qgZ int4|$all3" "qwZ int8 + hpZ + qgZ int4, stochastic|$all3 --quantized-gradients-stochastic" \
         "qwZ int8 + hpZ + qgZ int4, offload|$all3 --offload --offload-params"; do
  IFS='|' read -r name flags <<<"$v"
  [[ -n $ONLY && ! $name =~ ^($ONLY)$ ]] && continue
  # shellcheck disable=SC2086
  runs=$(seeded "$(printf '%s' "$name" | tr -c 'a-zA-Z0-9' '_')" $flags)
  echo "| $name | $(summarize "$runs" "$plain_runs") |"
done
echo "(per-step losses: $OUT/*.loss)" >&2
