#!/usr/bin/env bash
# Elastic restarts on this machine (docs/reliability.md): the main job's GPT on 4 ranks for STEPS
# steps (a checkpoint every K), uninterrupted, then with one rank lost at step AT and
# zerorun --max-restarts 1: rank 0 killed (SIGKILL), rank 2 killed, rank 1 stopped (SIGSTOP, found by
# --heartbeat-s); then on two launchers of 2 ranks each ("nodes") with checkpoints in memory every M
# steps (copies on the other node) and the checkpoint directory made read-only after its first save
# (a bind mount; root only, else left writable and said so), node 1 lost whole (its zerorun killed,
# its ranks with it) at step AT; and node 1's rank 3 stopped (SIGSTOP, found by node 1's heartbeat).
# Prints a markdown table: the layout the job went on at, the step it resumed from, the steps lost
# (the last step trained before the failure less that), the seconds from the failure to the next
# trained step (as the program prints them), the final validation loss and its difference from the
# uninterrupted run's. Logs stay in OUT (default a temp dir).
#   bash scripts/elastic_gpt.sh                      (STEPS=200 AT=50 K=10 M=5)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-200}
AT=${AT:-50}
K=${K:-10}
M=${M:-5}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bazel build //comm/launch:zerorun //examples/gpt:train_gpt >&2
B=bazel-bin

run() {  # name, zerorun's extra flags (one word), then train_gpt's extra flags
  local name=$1 launch=$2
  shift 2
  rm -rf "$OUT/$name.ckpt"
  # 48 rows per step in micro-batches of 4: dp 4 x 3 micro-batches, and dp 3 x 4 on three ranks.
  # shellcheck disable=SC2086
  "$B/comm/launch/zerorun" --nproc-per-node 4 $launch -- "$B/examples/gpt/train_gpt" --steps "$STEPS" \
    --batch 48 --micro-batches 3 --val-every "$STEPS" --sample-tokens 0 --save "$OUT/$name.ckpt" --save-every "$K" \
    --resume auto "$@" >"$OUT/$name.log" 2>&1
}

validation() { sed -n 's/^\[rank 0\] step *[0-9]* | validation loss \([0-9.]*\).*/\1/p' "$1" | tail -1; }

# The table's row for the run logged in $2: the layout it went on at, the step it resumed from, the
# steps lost (the last step trained before the line matching $3, zerorun's word of the failure,
# less that), the seconds from the failure to the next trained step, the final validation loss.
row() {  # title, log, failure line pattern, what the layout is followed by
  local title=$1 log=$2 failure=$3 after=${4:-} layout resumed last seconds loss diff
  grep -q "zerorun: restart 1 of 1" "$log" || { echo "$title: no restart (see $log)" >&2; exit 1; }
  layout=$(sed -n 's/^\[rank 0\] restart 1 after .*: \(dp [^,]*\), stage [0-9], \([0-9]* micro-batches\).*/\1 x \2/p' "$log")
  resumed=$(sed -n 's/^\[rank 0\] resumed from .* at step \([0-9]*\).*/\1/p' "$log")
  last=$(awk -v failure="$failure" '$0 ~ failure {exit} /^\[rank 0\] step +[0-9]+ \| loss/ {s = $4} END {print s}' "$log")
  seconds=$(sed -n 's/^\[rank 0\] restart 1: step [0-9]* trained \([0-9.]*\) s after the failure/\1/p' "$log")
  loss=$(validation "$log")
  diff=$(python3 -c "print(f'{($loss - $base) / $base:+.2e}')")
  echo "| $title | $layout$after | $resumed | $((last - resumed)) | $seconds | $loss | $diff |"
}

run uninterrupted ""
base=$(validation "$OUT/uninterrupted.log")
echo "| run | went on at | resumed at step | steps lost | s from the failure to the next step | validation loss | vs uninterrupted |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
echo "| uninterrupted, 4 ranks | dp 4 x 3 micro-batches | - | - | - | $base | - |"
for case in "rank 0 killed:--max-restarts=1:optimizer_step:kill:$AT:0" \
            "rank 2 killed:--max-restarts=1:optimizer_step:kill:$AT:2" \
            "rank 1 stopped (SIGSTOP):--max-restarts=1 --heartbeat-s=3:optimizer_step:stop:$AT:1"; do
  IFS=: read -r title launch point action nth who <<<"$case"
  name=$(echo "$title" | tr -c 'a-z0-9\n' '_')
  run "$name" "$launch" --fault "$point:$action:$nth" --fault-rank "$who"
  row "$title" "$OUT/$name.log" "zerorun: rank [0-9]+ \\(pid"
done

# Two launchers x 2 ranks ("nodes") with checkpoints in memory every M steps, copies on the other
# node. $1: the run's name; $2: the fault plan; $3: "read-only" to make the files' directory
# read-only once their first save is there; then zerorun's extra flags.
two_launchers() {
  local name=$1 fault=$2 files=$3 memory=/dev/shm/zero_elastic_gpt_$$ port k
  shift 3
  rm -rf "$memory" "$OUT/$name"
  mkdir -p "$OUT/$name"
  read_only=no
  if [ "$files" = read-only ] && mount --bind "$OUT/$name" "$OUT/$name" 2>/dev/null; then read_only=yes; fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for k in 1 0; do
    # shellcheck disable=SC2068
    ZERO_JOB_TOKEN=elastic-gpt-nodes "$B/comm/launch/zerorun" --nproc-per-node 2 --nnodes 1:2 --node-rank $k \
      --master-addr 127.0.0.1 --master-port "$port" --max-restarts 1 $@ -- "$B/examples/gpt/train_gpt" \
      --steps "$STEPS" --batch 48 --micro-batches 3 --val-every "$STEPS" --sample-tokens 0 --save "$OUT/$name/ckpt" \
      --save-every "$K" --save-memory "$memory" --save-memory-every "$M" --resume auto --fault "$fault" \
      >"$OUT/$name.node$k.log" 2>&1 &
  done
  if [ $read_only = yes ]; then
    until [ -f "$OUT/$name/ckpt/manifest.json" ]; do sleep 0.05; done
    mount -o remount,ro,bind "$OUT/$name"
  fi
  wait || true
  if [ $read_only = yes ]; then umount "$OUT/$name"; fi
  rm -rf "$memory"
  grep -q "resumed from $memory/node-0" "$OUT/$name.node0.log" ||
    { echo "$name: not resumed from the memory (see $OUT/$name.node0.log)" >&2; exit 1; }
}

# Node 1's rank 2 kills its zerorun (and so node 1) at step AT; the files turn read-only.
two_launchers node_1_lost "optimizer_step:kill_parent:$AT@2" read-only
row "node 1 lost whole (2 launchers x 2 ranks, memory every $M, files read-only: $read_only)" \
  "$OUT/node_1_lost.node0.log" "zerorun: the job failed elsewhere" " (memory)"
# Node 1's rank 3 stops (SIGSTOP): node 1's heartbeat finds it; the job goes on as 2 + 1 ranks.
two_launchers rank_3_stopped "optimizer_step:stop:$AT@3" writable --heartbeat-s=3
row "rank 3 stopped (SIGSTOP; 2 launchers x 2 ranks, memory every $M, --heartbeat-s 3)" \
  "$OUT/rank_3_stopped.node0.log" "zerorun: the job failed elsewhere" " (memory)"
echo "logs: $OUT" >&2
