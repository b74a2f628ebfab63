#!/usr/bin/env bash
# The soak run (docs/reliability.md, not CI): the GPT example at stage 3 with the optimizer offloaded
# on 4 ranks for 1,000 steps, a checkpoint every 100, killed once (the launcher, so every rank dies
# at once) after the step-400 checkpoint, resumed from it, and run to the end; then a table of the
# engine's tracker and the processes' resident memory every 100 steps, to show memory steady after
# warm-up. Flags after the script's name go to train_gpt (e.g. --n-layer 4).
#
#   bash scripts/soak.sh                 # ~10 minutes on the 2-core VM
#   STEPS=300 KILL_AFTER=150 bash scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-1000}
kill_after=${KILL_AFTER:-450}
out=${OUT:-/tmp/zero_soak}
rm -rf "$out"
mkdir -p "$out"
flags=(-c opt --config=native)
bazel build "${flags[@]}" //examples/gpt:train_gpt //comm/launch:zerorun
bin=$(bazel info "${flags[@]}" bazel-bin 2>/dev/null)
run=("$bin/comm/launch/zerorun" --nproc-per-node 4 -- "$bin/examples/gpt/train_gpt" --stage 3 --offload
     --steps "$steps" --batch 16 --save "$out/ckpt" --save-every 100 --val-every 100 --sample-tokens 0 "$@")

echo "== first run, killed after step $kill_after"
"${run[@]}" >"$out/first.log" 2>&1 &
job=$!
until grep -q "step *$kill_after |" "$out/first.log" 2>/dev/null; do
  if ! kill -0 "$job" 2>/dev/null; then
    echo "the first run ended before step $kill_after"; tail -20 "$out/first.log"; exit 1
  fi
  sleep 1
done
kill -9 "$job"  # zerorun's death kills every rank (PR_SET_PDEATHSIG)
wait "$job" || true
echo "killed at $(grep -c '] step .* | loss' "$out/first.log") progress lines; checkpoint: $(ls "$out/ckpt" | head -3 | tr '\n' ' ')"

echo "== resumed run"
"${run[@]}" --resume "$out/ckpt" >"$out/second.log" 2>&1
grep -h "resumed\|memory at step" "$out/first.log" "$out/second.log" | sed 's/^\[rank 0\] //'
tail -3 "$out/second.log"
