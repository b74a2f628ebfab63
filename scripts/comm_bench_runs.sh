#!/usr/bin/env bash
# Runs comm_bench several times at 2 ranks (each run a fresh pair of processes) and summarizes the
# ratio column (Gloo's time / ours) per op and size: median, min and max over the runs.
#
#   bash scripts/comm_bench_runs.sh [RUNS] [comm_bench flags...]
#   e.g. bash scripts/comm_bench_runs.sh 5 --min-bytes 1M --max-bytes 256M
#
# Why several processes: on a small shared machine one run can sit in a slow state for its whole
# life (where the scheduler put its threads, what else runs), which alternating calls inside a run
# cannot cancel; the median over runs can. The ranks run under SCHED_FIFO when chrt allows it.
# Each run's full table is kept under $COMM_BENCH_OUT (default /tmp/comm_bench_runs).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  runs=$1
  shift
fi
out=${COMM_BENCH_OUT:-/tmp/comm_bench_runs}
mkdir -p "$out"
rm -f "$out"/run_*.txt

bazel build //comm/benchmarks:comm_bench //comm/launch:zerorun >&2
bin=$(bazel info bazel-bin 2>/dev/null)
prefix=()
if chrt -f 10 true 2>/dev/null; then prefix=(chrt -f 10); fi

for ((i = 1; i <= runs; i++)); do
  echo "run $i of $runs" >&2
  "${prefix[@]}" "$bin/comm/launch/zerorun" --nproc-per-node 2 -- "$bin/comm/benchmarks/comm_bench" "$@" \
    > "$out/run_$i.txt" 2>&1
done

# Rank 0's rows: "[rank 0] size count type redop | us algbw busbw wrong | us algbw busbw wrong | ratio"
cat "$out"/run_*.txt | awk '
  $1 == "[rank" && $2 == "0]" && $3 == "#" && NF == 4 { op = $4; next }
  $1 == "[rank" && $2 == "0]" && $5 == "float" {
    key = op " " $3
    if (!(key in n)) order[++keys] = key
    r[key, ++n[key]] = $NF + 0
    ours[key, n[key]] = $10 + 0
    theirs[key, n[key]] = $15 + 0
    wrong[key] += $11 + $16
  }
  # p2p rows: "[rank 0] size | ours_us gloo_us ratio | ours_GB/s gloo_GB/s ratio | wrong"
  $1 == "[rank" && $2 == "0]" && $4 == "|" && $8 == "|" && NF == 13 {
    add("p2p-latency " $3, $7, $5, $6, $13)
    add("p2p-stream " $3, $11, $9, $10, 0)
  }
  function add(key, ratio, a, b, w) {
    if (!(key in n)) order[++keys] = key
    r[key, ++n[key]] = ratio + 0
    ours[key, n[key]] = a + 0
    theirs[key, n[key]] = b + 0
    wrong[key] += w
  }
  function median(a, k, m,    i, j, t, v) {
    for (i = 1; i <= m; i++) v[i] = a[k, i]
    for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
  }
  END {
    printf "%-15s %12s %5s | %12s %12s | %7s %7s %7s | %6s\n", "op", "size(B)", "runs",
           "ours", "gloo", "median", "min", "max", "#wrong"
    for (i = 1; i <= keys; i++) {
      key = order[i]; m = n[key]; split(key, f, " ")
      lo = hi = r[key, 1]
      for (j = 2; j <= m; j++) { if (r[key, j] < lo) lo = r[key, j]; if (r[key, j] > hi) hi = r[key, j] }
      printf "%-15s %12s %5d | %12.3f %12.3f | %7.3f %7.3f %7.3f | %6d\n", f[1], f[2], m,
             median(ours, key, m), median(theirs, key, m), median(r, key, m), lo, hi, wrong[key]
    }
    print "# ratio = Gloo time / ours per run (> 1: ours faster); ours and gloo: median over runs of"
    print "# busbw (GB/s) for the collectives, of latency (us) for p2p-latency, of GB/s for p2p-stream"
  }'
