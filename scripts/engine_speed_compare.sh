#!/usr/bin/env bash
# Step time of an example at several ZeRO stages for two builds side by side: the working tree and
# an earlier commit (default: the parent of HEAD) built in a worktree beside it. Runs alternate
# (a b b a ...) for ROUNDS rounds; each run is a 2-rank run of STEPS steps, timed whole (start-up is
# the same for both), and the table gives each side's median seconds per step.
#
#   bash scripts/engine_speed_compare.sh [BASE_COMMIT]
#
# Settings (environment): ROUNDS=5 STEPS=60 STAGES="0 1 2" PROGRAM=examples:train_mlp (a Bazel
# label) and ARGS (the program's other flags; default for train_mlp: --hidden $HIDDEN, HIDDEN=1024).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
rounds=${ROUNDS:-5}
steps=${STEPS:-60}
hidden=${HIDDEN:-1024}
stages=${STAGES:-0 1 2}
program=${PROGRAM:-examples:train_mlp}
if [[ $program == examples:train_mlp ]]; then args=${ARGS:---hidden $hidden}; else args=${ARGS:-}; fi
binary=${program/://}  # bazel-bin path
wt=${BASE_WORKTREE:-/tmp/zero_speed_base}

if [[ ! -d "$wt" ]]; then git worktree add -q "$wt" "$base"; else git -C "$wt" checkout -q "$base"; fi
bazel build -c opt //comm/launch:zerorun "//$program" >/dev/null 2>&1
(cd "$wt" && bazel build -c opt "//$program" >/dev/null 2>&1 &&
  { bazel build -c opt //comm/launch:zerorun >/dev/null 2>&1 || bazel build -c opt //comm:zerorun >/dev/null 2>&1; })
new_run="$PWD/bazel-bin/comm/launch/zerorun"
base_run="$wt/bazel-bin/comm/launch/zerorun"
[[ -x "$base_run" ]] || base_run="$wt/bazel-bin/comm/zerorun"

time_run() {  # launcher, program, stage -> seconds per step
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086  # ARGS is a list of flags
  "$1" --nproc-per-node 2 -- "$2" --stage "$3" --steps "$steps" $args >/dev/null 2>&1
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v s="$steps" 'BEGIN { print (b - a) / s }'
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

printf "%-6s %14s %14s %8s   (%s rounds, %s steps, %s %s, 2 ranks)\n" stage "base ms/step" "new ms/step" "new/base" \
  "$rounds" "$steps" "$program" "$args"
for stage in $stages; do
  a=() b=()
  for ((r = 0; r < rounds; r++)); do
    if ((r % 2 == 0)); then
      a+=("$(time_run "$base_run" "$wt/bazel-bin/$binary" "$stage")")
      b+=("$(time_run "$new_run" "$PWD/bazel-bin/$binary" "$stage")")
    else
      b+=("$(time_run "$new_run" "$PWD/bazel-bin/$binary" "$stage")")
      a+=("$(time_run "$base_run" "$wt/bazel-bin/$binary" "$stage")")
    fi
  done
  ma=$(printf "%s\n" "${a[@]}" | median)
  mb=$(printf "%s\n" "${b[@]}" | median)
  awk -v s="$stage" -v a="$ma" -v b="$mb" 'BEGIN { printf "%-6s %14.2f %14.2f %8.3f\n", s, a * 1000, b * 1000, b / a }'
done
