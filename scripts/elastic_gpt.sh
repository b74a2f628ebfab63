#!/usr/bin/env bash
# Elastic restarts on this machine (docs/reliability.md): the main job's GPT on 4 ranks for STEPS
# steps (a checkpoint every K), uninterrupted, then with one rank lost at step AT and
# zerorun --max-restarts 1: rank 0 killed (SIGKILL), rank 2 killed, rank 1 stopped (SIGSTOP, found by
# --heartbeat-s); then on two launchers of 2 ranks each ("nodes") with checkpoints in memory every M
# steps (copies on the other node) and the checkpoint directory made read-only after its first save
# (a bind mount; root only, else left writable and said so), node 1 lost whole (its zerorun killed,
# its ranks with it) at step AT. Prints a markdown table: the layout the job went on at, the step it resumed from,
# the steps lost (the last step trained before the failure less that), the seconds from the failure
# to the next trained step (as the program prints them), the final validation loss and its
# difference from the uninterrupted run's. Logs stay in OUT (default a temp dir).
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
  log="$OUT/$name.log"
  grep -q "zerorun: restart 1 of 1" "$log" || { echo "$title: no restart (see $log)" >&2; exit 1; }
  layout=$(sed -n 's/^\[rank 0\] restart 1 after .*: \(dp [^,]*\), stage [0-9], \([0-9]* micro-batches\).*/\1 x \2/p' "$log")
  resumed=$(sed -n 's/^\[rank 0\] resumed from .* at step \([0-9]*\).*/\1/p' "$log")
  # The last step printed before zerorun saw the failure.
  last=$(awk '/zerorun: rank [0-9]+ \(pid/ {exit} /^\[rank 0\] step +[0-9]+ \| loss/ {s = $4} END {print s}' "$log")
  seconds=$(sed -n 's/^\[rank 0\] restart 1: step [0-9]* trained \([0-9.]*\) s after the failure/\1/p' "$log")
  loss=$(validation "$log")
  diff=$(python3 -c "print(f'{($loss - $base) / $base:+.2e}')")
  echo "| $title | $layout | $resumed | $((last - resumed)) | $seconds | $loss | $diff |"
done

# Two launchers x 2 ranks; node 1's rank 2 kills its zerorun (and so node 1) at step AT.
name=node_1_lost
memory=/dev/shm/zero_elastic_gpt_$$
rm -rf "$memory"
mkdir -p "$OUT/ro"
rm -rf "$OUT/ro/ckpt"
read_only=no
if mount --bind "$OUT/ro" "$OUT/ro" 2>/dev/null; then read_only=yes; fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for k in 1 0; do
  ZERO_JOB_TOKEN=elastic-gpt-nodes "$B/comm/launch/zerorun" --nproc-per-node 2 --nnodes 1:2 --node-rank $k \
    --master-addr 127.0.0.1 --master-port "$port" --max-restarts 1 -- "$B/examples/gpt/train_gpt" --steps "$STEPS" \
    --batch 48 --micro-batches 3 --val-every "$STEPS" --sample-tokens 0 --save "$OUT/ro/ckpt" --save-every "$K" \
    --save-memory "$memory" --save-memory-every "$M" --resume auto --fault "optimizer_step:kill_parent:$AT@2" \
    >"$OUT/$name.node$k.log" 2>&1 &
done
if [ $read_only = yes ]; then
  until [ -f "$OUT/ro/ckpt/manifest.json" ]; do sleep 0.05; done
  mount -o remount,ro,bind "$OUT/ro"
fi
wait || true
[ $read_only = yes ] && umount "$OUT/ro"
rm -rf "$memory"
log="$OUT/$name.node0.log"
grep -q "resumed from $memory/node-0" "$log" || { echo "node 1 lost: not resumed from the memory (see $log)" >&2; exit 1; }
layout=$(sed -n 's/^\[rank 0\] restart 1 after .*: \(dp [^,]*\), stage [0-9], \([0-9]* micro-batches\).*/\1 x \2/p' "$log")
resumed=$(sed -n 's/^\[rank 0\] resumed from .* at step \([0-9]*\).*/\1/p' "$log")
last=$(awk '/zerorun: the job failed elsewhere/ {exit} /^\[rank 0\] step +[0-9]+ \| loss/ {s = $4} END {print s}' "$log")
seconds=$(sed -n 's/^\[rank 0\] restart 1: step [0-9]* trained \([0-9.]*\) s after the failure/\1/p' "$log")
loss=$(validation "$log")
diff=$(python3 -c "print(f'{($loss - $base) / $base:+.2e}')")
echo "| node 1 lost whole (2 launchers x 2 ranks; memory every $M, files read-only: $read_only) | $layout (memory) | $resumed | $((last - resumed)) | $seconds | $loss | $diff |"
echo "logs: $OUT" >&2
