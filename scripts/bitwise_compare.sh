#!/usr/bin/env bash
# Deterministic runs of the working tree against an earlier commit (default: the parent of HEAD),
# built in a worktree beside it: train_mlp and train_gpt at every ZeRO stage (and with offload), each
# on 2 ranks with --deterministic, must print the same loss lines and export byte-identical
# safetensors; and train_gpt over 2 pipeline stages under every schedule (at one layout every schedule
# gives the same bits: the last lines compare them with each other). For refactors that must not
# change a bit.
#
#   bash scripts/bitwise_compare.sh [BASE_COMMIT]
#
# Settings (environment): STEPS=20, BASE_WORKTREE=/tmp/zero_speed_base (shared with
# engine_speed_compare.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
steps=${STEPS:-20}
wt=${BASE_WORKTREE:-/tmp/zero_speed_base}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [[ ! -d "$wt" ]]; then git worktree add -q "$wt" "$base"; else git -C "$wt" checkout -q "$base"; fi
targets=(//comm/launch:zerorun //examples:train_mlp //examples/gpt:train_gpt)
bazel build -c opt "${targets[@]}" >/dev/null 2>&1
(cd "$wt" && bazel build -c opt "${targets[@]}" >/dev/null 2>&1)

run() {  # tree, name, program, args... -> loss lines in $out/name.log, export in $out/name.safetensors
  local tree=$1 name=$2 program=$3
  shift 3
  "$tree/bazel-bin/comm/launch/zerorun" --nproc-per-node 2 -- "$tree/bazel-bin/$program" --deterministic \
    --steps "$steps" --export "$out/$name.safetensors" "$@" 2>&1 | grep -E '\] step ' | sed -E 's/^.*\] step/step/; s/ *\|[^|]*tok\/s.*$//' \
    >"$out/$name.log"  # train_gpt's lines end with timings: cut from its tokens per second on
}

cases=(
  "mlp0 examples/train_mlp --stage 0"
  "mlp1 examples/train_mlp --stage 1"
  "mlp2 examples/train_mlp --stage 2"
  "mlp3 examples/train_mlp --stage 3"
  "mlp1o examples/train_mlp --stage 1 --offload"
  "mlp3p examples/train_mlp --stage 3 --offload-params"
  "mlp2a examples/train_mlp --stage 2 --micro-steps 2"
  "mlp0a examples/train_mlp --stage 0 --micro-steps 2"
  "gpt2 examples/gpt/train_gpt --stage 2"
  "gpt3 examples/gpt/train_gpt --stage 3"
  "gpt3a examples/gpt/train_gpt --stage 3 --micro-steps 2"
  "gpipe3 examples/gpt/train_gpt --stage 3 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule gpipe"
  "1f1b3 examples/gpt/train_gpt --stage 3 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule 1f1b"
  "inter3 examples/gpt/train_gpt --stage 3 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule interleaved --chunks 2"
  "zbh1_3 examples/gpt/train_gpt --stage 3 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule zb-h1"
  "1f1b1 examples/gpt/train_gpt --stage 1 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule 1f1b"
  "zbh1_1 examples/gpt/train_gpt --stage 1 --n-layer 4 --pp 2 --micro-batches 4 --pp-schedule zb-h1"
)
printf '%-8s %-40s %s\n' case "loss lines" export
failed=0
for c in "${cases[@]}"; do
  read -r name program args <<<"$c"
  # shellcheck disable=SC2086  # args is a list of flags
  run "$PWD" "new-$name" "$program" $args
  # shellcheck disable=SC2086
  run "$wt" "base-$name" "$program" $args
  lines=$(wc -l <"$out/new-$name.log")
  if [[ $lines -eq 0 ]]; then losses="no loss lines"; failed=1
  elif cmp -s "$out/new-$name.log" "$out/base-$name.log"; then losses="same ($lines lines)"
  else losses="DIFFER"; failed=1; fi
  if cmp -s "$out/new-$name.safetensors" "$out/base-$name.safetensors"; then export="identical"
  else export="DIFFER"; failed=1; fi
  printf '%-8s %-40s %s\n' "$name" "$losses" "$export"
done
# Across schedules at one layout and stage: the same loss lines.
for stage in 3 1; do
  first=""
  for name in "gpipe$stage" "1f1b$stage" "inter$stage" "zbh1_$stage"; do
    [[ -f "$out/new-$name.log" ]] || continue
    if [[ -z $first ]]; then first=$name; continue; fi
    if cmp -s "$out/new-$first.log" "$out/new-$name.log"; then echo "stage $stage: $name's losses = $first's"
    else echo "stage $stage: $name's losses DIFFER from $first's"; failed=1; fi
  done
done
exit $failed
