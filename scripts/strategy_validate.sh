#!/usr/bin/env bash
# The strategy planner against this machine: calibrates it (calibrate_gpt: the GPT's own kernels,
# the communicator's link, the engine's step), asks zero_plan --auto for every layout of the GPT at
# N = 1, 2 and 4 ranks, runs each selected layout with train_gpt, and prints predicted next to
# measured: the step time (median after warm-up) and the largest activation peak (exact bytes);
# per N the Kendall tau of the two rankings and where the planner's first choice lands.
#
#   bash scripts/strategy_validate.sh            (about 20 minutes on 2 cores)
#   NS="1 2" STEPS=20 bash scripts/strategy_validate.sh
#
# Selected: the planner's first 8 choices, and every layout without offload whose micro-batches are
# pp or 2 pp (at N = 4 also only ZeRO stages 1 and 3), so that each (dp, tp, pp), schedule and
# sequence-parallel choice is run.
#
# Noise: with REPEATS=k every layout runs k times (default 1) and keeps its fastest median. Two
# did not bring the predictions closer here: the calibration carries the same noise
# (docs/strategy.md). A run during which the hypervisor took more than STEAL_MAX (default 0.02) of
# the machine's time (steal, /proc/stat) runs again, up to STEAL_TRIES (3) times in all, keeping the
# least disturbed; each layout's steal is printed. The calibration is taken again, up to CAL_TRIES
# (3) times in all, while its kernels' rounds fall more than CAL_SPREAD (default 20) percent apart
# at the median kernel, keeping the least spread. After each N, the first choice and the three
# layouts measured fastest run FINAL_RUNS (5) times more, taking turns, and their medians are
# compared (final.tsv).
#
# Drift: this machine's speed moves by more than 20% within a sweep. The planner's first choice is
# the reference: it runs again after every REF_EVERY (default 6) layouts, and each layout's
# measured time is also compared to the reference's measured next to it (interpolated between the
# runs before and after), as a ratio against the same ratio predicted. That comparison does not
# move with the machine's speed (nor with an error the calibration makes on every layout alike).
# Output under $OUT (default /tmp/strategy_validate): cluster.json, plan_N.tsv, runs/, results.tsv,
# reference.tsv (the reference's runs: how far apart the same work's medians fall here),
# strategy_frontier_n2.svg (docs/images/ holds the one docs/validation/strategy_sweeps.md shows).
#
# The calibration runs on CORES ranks (default: this machine's cores); for each N above CORES the
# tp parts are timed again on N ranks. On a machine without Bazel
# (no network there), in two halves:
#   bash scripts/strategy_validate.sh pack DIR         here: builds the four programs and packs them,
#                                                      their shared libraries and this script into DIR
#   BIN=DIR bash DIR/strategy_validate.sh              there
# and `bash scripts/strategy_validate.sh summary OUT` prints the tables again from a run's output
# (one cut short too: the layouts it measured).
set -euo pipefail
[[ ${1:-} == summary ]] && summary_of=$(realpath "${2:?usage: strategy_validate.sh summary DIR}")
cd "$(dirname "$0")/.."
# An awk function for the programs below: the median of a[1..m] (sorting a in place).
awk_median='function median(a, m,   i, j, v) {
  for (i = 2; i <= m; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j+1] = a[j]; a[j+1] = v }
  return (m % 2) ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2
}'
# Per N: the table, Kendall tau between the predicted and measured orders, the first choice; and
# against the reference run next to each layout (interpolated between the runs before and after).
summarize() {  # output folder
  awk -F'\t' '
  FNR == NR { rn[$1]++; rs[$1, rn[$1]] = $2; rm[$1, rn[$1]] = $3; rp[$1] = $4; next }
  { n = $1; c[n]++; i = c[n]; key[n, i] = $3; p[n, i] = $4; m[n, i] = $5; pa[n, i] = $6; ma[n, i] = $7; sq[n, i] = $8; st[n, i] = (NF >= 9 ? $9 : "-") }
  function reference(n, s,   j, a, b) {  # the reference measured at run s: interpolated
    a = 0; b = 0
    for (j = 1; j <= rn[n]; j++) { if (rs[n, j] <= s) a = j; if (rs[n, j] >= s && b == 0) b = j }
    if (a == 0) return rm[n, b]
    if (b == 0 || rs[n, b] == rs[n, a]) return rm[n, a]
    return rm[n, a] + (rm[n, b] - rm[n, a]) * (s - rs[n, a]) / (rs[n, b] - rs[n, a])
  }
  END {
    for (n = 1; n <= 64; n++) {
      if (!(n in c)) continue
      printf "\nN = %d: %d layouts\n%-36s %12s %12s %8s %10s %14s %14s %7s\n", n, c[n], "layout", "predicted ms", "measured ms", "ratio", "vs ref.", "act. planned", "act. measured", "steal"
      within = 0; exact = 0; best = 1; worst = 0; rwithin = 0; rworst = 0
      for (i = 1; i <= c[n]; i++) {
        r = p[n, i] / m[n, i]
        rr = (p[n, i] / rp[n]) / (m[n, i] / reference(n, sq[n, i]))
        printf "%-36s %12.2f %12.2f %8.3f %10.3f %14s %14s %7s\n", key[n, i], p[n, i], m[n, i], r, rr, pa[n, i], ma[n, i], (st[n, i] == "-" ? "-" : sprintf("%.3f", st[n, i]))
        if (r >= 0.8 && r <= 1.2) within++
        if (rr >= 0.8 && rr <= 1.2) rwithin++
        if (pa[n, i] == ma[n, i]) exact++
        if (m[n, i] < m[n, best]) best = i
        e = (r > 1 ? r - 1 : 1 - r); if (e > worst) worst = e
        e = (rr > 1 ? rr - 1 : 1 - rr); if (e > rworst) rworst = e
      }
      lo = rm[n, 1]; hi = rm[n, 1]
      for (j = 1; j <= rn[n]; j++) { if (rm[n, j] < lo) lo = rm[n, j]; if (rm[n, j] > hi) hi = rm[n, j] }
      conc = 0; disc = 0
      for (i = 1; i <= c[n]; i++) for (j = i + 1; j <= c[n]; j++) {
        s = (p[n, i] - p[n, j]) * (m[n, i] - m[n, j])
        if (s > 0) conc++; else if (s < 0) disc++
      }
      tau = (conc + disc) > 0 ? (conc - disc) / (conc + disc) : 1
      printf "within 20%%: %d of %d (largest error %.1f%%); activations exact: %d of %d; Kendall tau %.3f\n", within, c[n], 100 * worst, exact, c[n], tau
      printf "against the reference next to each: within 20%%: %d of %d (largest error %.1f%%); the reference (%s) ran %d times, %.2f-%.2f ms (%.1f%% apart)\n", rwithin, c[n], 100 * rworst, key[n, 1], rn[n], lo, hi, 100 * (hi / lo - 1)
      printf "first choice %s measured %.2f ms; fastest measured %s at %.2f ms (first choice %+.1f%%)\n", key[n, 1], m[n, 1], key[n, best], m[n, best], 100 * (m[n, 1] / m[n, best] - 1)
    }
  }' "$1/reference.tsv" "$1/results.tsv"
  [[ -s $1/final.tsv ]] || return 0
  # The final round (final.tsv: N, layout, measured ms, steal): each finalist's median over its
  # runs; the first listed at each N is the planner's first choice.
  awk -F'\t' "$awk_median"'
  { n = $1; if (!((n, $2) in idx)) { idx[n, $2] = ++c[n]; name[n, c[n]] = $2 }; i = idx[n, $2]; t[n, i, ++k[n, i]] = $3 }
  function finalist_median(n, i,   a, j) {
    for (j = 1; j <= k[n, i]; j++) a[j] = t[n, i, j]
    return median(a, k[n, i])
  }
  END {
    for (n = 1; n <= 64; n++) {
      if (!(n in c)) continue
      best = 1
      for (i = 1; i <= c[n]; i++) { med[i] = finalist_median(n, i); if (med[i] < med[best]) best = i }
      printf "\nN = %d, the final round (each finalist run %d times, taking turns; median):\n", n, k[n, 1]
      for (i = 1; i <= c[n]; i++) printf "  %-36s %10.2f ms%s\n", name[n, i], med[i], (i == 1 ? "  (first choice)" : "")
      printf "first choice %+.1f%% against the fastest finalist (%s)\n", 100 * (med[1] / med[best] - 1), name[n, best]
    }
  }' "$1/final.tsv"
}

targets=(//comm/launch:zerorun //examples/gpt:train_gpt //examples/gpt:calibrate_gpt //tools/plan:zero_plan)
if [[ ${1:-} == summary ]]; then
  summarize "$summary_of"
  exit 0
fi
if [[ ${1:-} == pack ]]; then
  dir=${2:?usage: strategy_validate.sh pack DIR}
  bazel build -c opt "${targets[@]}" >&2
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  rm -rf "$dir" && mkdir -p "$dir"
  for t in "${targets[@]}"; do
    path=${t#//}
    install -m 755 "$bin/${path/://}" "$dir/"
    strip --strip-all "$dir/$(basename "${path/://}")"
  done
  bash scripts/pack_libs.sh "$dir"
  install -m 755 scripts/strategy_validate.sh "$dir/"
  exit 0
fi
if [[ -n ${BIN:-} ]]; then
  bin=$(realpath "$BIN")
  zerorun=$bin/zerorun train_gpt=$bin/train_gpt calibrate_gpt=$bin/calibrate_gpt zero_plan=$bin/zero_plan
  export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  bazel build -c opt "${targets[@]}" >&2
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  zerorun=$bin/comm/launch/zerorun train_gpt=$bin/examples/gpt/train_gpt calibrate_gpt=$bin/examples/gpt/calibrate_gpt
  zero_plan=$bin/tools/plan/zero_plan
fi
out=${OUT:-/tmp/strategy_validate}
steps=${STEPS:-25}
ns=${NS:-1 2 4}
ref_every=${REF_EVERY:-6}
repeats=${REPEATS:-1}
steal_max=${STEAL_MAX:-0.02}
steal_tries=${STEAL_TRIES:-3}
cal_spread_max=${CAL_SPREAD:-20}
cal_tries=${CAL_TRIES:-3}
final_runs=${FINAL_RUNS:-5}
mkdir -p "$out/runs"
gpt=4,64,4,256,64
batch=16
model=(--n-layer 4 --n-embd 64 --n-head 4 --block-size 64)
cores=${CORES:-$(nproc)}

# The fraction of all CPU time since a /proc/stat "cpu" line that the hypervisor took (steal, the
# eighth field): time the VM's cores were not running at all. 0 where there is no such field.
steal_since() {  # the "cpu" line before
  awk -v before="$1" '$1 == "cpu" {
    n = split(before, b, " "); total = 0
    for (i = 2; i <= NF && i <= n; i++) total += $i - b[i]
    print (total > 0 && NF >= 9 ? ($9 - b[9]) / total : 0); exit }' /proc/stat
}

# The calibration, taken again (up to CAL_TRIES times in all) when its kernels' rounds fell more
# than CAL_SPREAD percent apart at the median kernel: the machine's speed moved while they were
# timed, and a calibration from a slow moment prices every layout off alike. The least spread is
# kept as cluster.json (each try's output in calibration.K.log).
best_spread=""
for ((try = 1; try <= cal_tries; try++)); do
  echo "== calibrating on $cores ranks (try $try)" >&2
  before=$(head -1 /proc/stat)
  "$zerorun" --nproc-per-node "$cores" -- "$calibrate_gpt" --gpt "$gpt" --batch "$batch" \
    --world 4 --out "$out/cluster.$try.json" 2>&1 | tee "$out/calibration.$try.log" >&2
  steal=$(steal_since "$before")
  spread=$(grep -o 'fell [0-9]*% apart at the median kernel' "$out/calibration.$try.log" | tr -dc '0-9')
  spread=${spread:-0}  # one round: nothing to compare
  echo "== calibration $try: kernel rounds $spread% apart at the median kernel, steal $steal" >&2
  if [[ -z $best_spread ]] || ((spread < best_spread)); then
    best_spread=$spread
    cp "$out/cluster.$try.json" "$out/cluster.json"
    echo "$steal" >"$out/calibration.steal"
  fi
  ((spread <= cal_spread_max)) && break
done
echo "== kept the calibration with its rounds $best_spread% apart (steal $(cat "$out/calibration.steal"))" >&2

# An N above the cores crowds them: its tp parts are timed again on N ranks (calibrate_gpt
# --add-tp-parts), where the tp groups' waits meet that crowding (calibration.crowded.N.log).
for n in $ns; do
  ((n > cores)) || continue
  echo "== timing the tp parts on $n ranks" >&2
  "$zerorun" --nproc-per-node "$n" -- "$calibrate_gpt" --gpt "$gpt" --batch "$batch" \
    --world 4 --add-tp-parts "$out/cluster.json" 2>&1 | tee "$out/calibration.crowded.$n.log" >&2
done

# The median of the step times after the first 5 steps, and the last activation peak (bytes), from
# the run's metrics (LOG.jsonl, train_gpt --metrics).
measure() {
  awk "$awk_median"'
       /"loss"/ {
         n++
         if (match($0, /"step_ms": [0-9.e+-]+/)) ms = substr($0, RSTART + 11, RLENGTH - 11)
         if (match($0, /"activation_bytes": [0-9]+/)) act = substr($0, RSTART + 20, RLENGTH - 20)
         if (n > 5) t[++k] = ms
       }
       END {
         if (k == 0) { print "nan", "nan"; exit }
         print median(t, k), act
       }' "$1.jsonl"
}

# train_gpt on N ranks with a layout's flags, every step logged (LOG.jsonl the metrics); LOG.steal is the fraction of the
# machine's time its hypervisor took (steal) during the run. A run with more steal than STEAL_MAX
# runs again, up to STEAL_TRIES times in all, and the least disturbed run is kept in LOG: the
# layout's time is what it takes on the machine, not while the machine is taken away.
run_once() {  # N, flags, log
  local before status
  before=$(head -1 /proc/stat)
  # shellcheck disable=SC2086
  "$zerorun" --nproc-per-node "$1" -- "$train_gpt" "${model[@]}" --batch "$batch" \
    --steps "$steps" --val-every 0 --sample-tokens 0 --log-every 1 --metrics "$3.jsonl" $2 >"$3" 2>&1
  status=$?
  steal_since "$before" >"$3.steal"
  return $status
}
run_layout() {  # N, flags, log
  run_once "$@" || return
  local try
  for ((try = 2; try <= steal_tries; try++)); do
    awk -v s="$(cat "$3.steal")" -v max="$steal_max" 'BEGIN { exit !(s > max) }' || return 0
    echo "  $(basename "$3" .log): steal $(cat "$3.steal") during the run; again" >&2
    run_once "$1" "$2" "$3.try" || return
    if awk -v a="$(cat "$3.try.steal")" -v b="$(cat "$3.steal")" 'BEGIN { exit !(a < b) }'; then
      mv "$3.try" "$3" && mv "$3.try.steal" "$3.steal" && mv "$3.try.jsonl" "$3.jsonl"
    fi
  done
  rm -f "$3.try" "$3.try.steal" "$3.try.jsonl"
}

: >"$out/results.tsv"
: >"$out/reference.tsv"
: >"$out/final.tsv"
first=()
for n in $ns; do
  seq=0  # runs at this N, the reference's included
  "$zero_plan" --auto --list --gpt "$gpt" --batch "$batch" --world "$n" \
    --cluster "$out/cluster.json" >"$out/plan_$n.tsv"
  rank=0
  while IFS=$'\t' read -r key flags _ ms _ act fits; do
    rank=$((rank + 1))
    [[ $fits == 1 ]] || continue
    if ((rank > 8)); then
      [[ $key == *.off || $key == *.off.rc ]] && continue
      pp=${key#*.pp}; pp=${pp%%.*}; m=${key#*.m}; m=${m%%.*}
      ((m == pp || m == 2 * pp)) || continue
      if ((n == 4)); then [[ ($key == *.z1.* || $key == *.z3.*) && $key != *.rc ]] || continue; fi
    fi
    log="$out/runs/$key.log"
    if ! run_layout "$n" "$flags" "$log"; then
      echo "run failed: $key ($flags); see $log" >&2
      continue
    fi
    read -r measured measured_act < <(measure "$log")
    # REPEATS runs of the layout, the fastest median kept: noise only adds time, and the model
    # predicts an undisturbed machine.
    for ((k = 2; k <= repeats; k++)); do
      run_layout "$n" "$flags" "$log.$k" || continue
      read -r again _ < <(measure "$log.$k")
      measured=$(awk -v a="$measured" -v b="$again" 'BEGIN { print (b < a ? b : a) }')
    done
    seq=$((seq + 1))
    if ((${#first[@]} == 0)); then  # the planner's first choice that ran: the reference
      first=("$key" "$flags" "$measured" "$ms")
      printf '%s\t%s\t%s\t%s\n' "$n" "$seq" "$measured" "$ms" >>"$out/reference.tsv"
    fi
    steal=$(cat "$log.steal")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$rank" "$key" "$ms" "$measured" "$act" "$measured_act" "$seq" \
      "$steal" >>"$out/results.tsv"
    printf '%-36s predicted %8.2f ms  measured %8.2f ms  ratio %.3f  activations %s / %s  steal %.3f\n' "$key" "$ms" \
      "$measured" "$(awk -v a="$ms" -v b="$measured" 'BEGIN { print a / b }')" "$act" "$measured_act" "$steal" >&2
    if ((seq % ref_every == 0)); then
      seq=$((seq + 1))
      run_layout "$n" "${first[1]}" "$out/runs/${first[0]}.ref$seq.log" &&
        printf '%s\t%s\t%s\t%s\n' "$n" "$seq" "$(measure "$out/runs/${first[0]}.ref$seq.log" | cut -d' ' -f1)" "${first[3]}" \
          >>"$out/reference.tsv"
    fi
  done <"$out/plan_$n.tsv"
  # The reference once more at the end, so that the last layouts sit between two of its runs.
  if ((${#first[@]} > 0)); then
    seq=$((seq + 1))
    run_layout "$n" "${first[1]}" "$out/runs/${first[0]}.ref$seq.log" &&
      printf '%s\t%s\t%s\t%s\n' "$n" "$seq" "$(measure "$out/runs/${first[0]}.ref$seq.log" | cut -d' ' -f1)" "${first[3]}" \
        >>"$out/reference.tsv"
  fi
  # The final round: one run of a layout set against the fastest of a hundred runs compares one
  # draw with the luckiest of many. So the first choice and the three layouts measured fastest run
  # again, FINAL_RUNS times each, taking turns, and their medians are compared.
  if ((${#first[@]} > 0 && final_runs > 0)); then
    finalists=("${first[0]}")
    while read -r key; do
      [[ $key == "${first[0]}" ]] || finalists+=("$key")
    done < <(awk -F'\t' -v n="$n" '$1 == n { print $5, $3 }' "$out/results.tsv" | sort -g | head -4 | cut -d' ' -f2)
    for ((r = 1; r <= final_runs; r++)); do
      for key in "${finalists[@]:0:4}"; do
        flags=$(awk -F'\t' -v k="$key" '$1 == k { print $2; exit }' "$out/plan_$n.tsv")
        log="$out/runs/$key.final$r.log"
        run_layout "$n" "$flags" "$log" &&
          printf '%s\t%s\t%s\t%s\n' "$n" "$key" "$(measure "$log" | cut -d' ' -f1)" "$(cat "$log.steal")" >>"$out/final.tsv"
      done
    done
  fi
  first=()
done

# The N = 2 search as a chart (time against memory, the frontier), viewed in headless Chromium.
"$zero_plan" --auto --gpt "$gpt" --batch "$batch" --world 2 --cluster "$out/cluster.json" --top 0 \
  --svg "$out/strategy_frontier_n2.svg" >/dev/null
[[ -f scripts/screenshot_check.sh ]] && bash scripts/screenshot_check.sh "$out/strategy_frontier_n2.svg" "$out/strategy_frontier_n2.png" 900,560 >&2

summarize "$out"
