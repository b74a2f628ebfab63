#!/usr/bin/env bash
# The planner beside published 3D runs (docs/strategy.md, "Against published layouts"): Megatron-LM's
# weak-scaling rows (Narayanan et al. 2021, Table 1), BLOOM 176B and GPT-NeoX-20B, each planned on
# its cluster (docs/validation/cluster_*.json) as Megatron's GPT (zero_plan --megatron, fp16).
# Per row:
#   - the published run's layout, as it ran, predicted (zero_plan --explain): its TFLOP/s per GPU in
#     the paper's formula (96 B s l h^2 (1 + s/6h + V/16lh), recompute counted) beside the published
#     figure. This checks the time model: the same work on the same layout.
#   - the search's time (zero_plan --top 3) and its choice, the choice's step against the published
#     run's, the best layout with the published (tp, pp) against the choice, and the rank of the
#     published (tp, pp) among the distinct pairs of the first 50 planned layouts (a second search,
#     not timed).
# EFF (the matmul efficiency, default 0.55) is calibrated on one row; SENS=1 adds the choice with the
# efficiency and the bandwidth between nodes each moved by 20%; ONLY=<word> runs the rows naming it.
#   bash scripts/strategy_published.sh [> table.md]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //tools/plan:zero_plan >&2
Z=bazel-out/k8-opt/bin/tools/plan/zero_plan
EFF=${EFF:-0.55}
SENS=${SENS:-0}
ONLY=${ONLY:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | L,h,a,V,s | GPUs | batch | published tp | pp | TFLOP/s per GPU | cluster | the rest of the
# published run's layout. Megatron's rows as its examples/sc21/run_table_1.sh runs them: no sharded
# optimizer (stage 0), full recompute, micro-batches = batch / (dp x its micro-batch size), the
# interleaved schedule where it sets layers per virtual stage. BLOOM and GPT-NeoX: ZeRO-1, recompute,
# DeepSpeed's 1F1B pipeline, their published micro-batch sizes (2 and 4).
rows=(
  "Megatron 1.7B|24,2304,24,51200,2048|32|512|1|1|137|selene|stage=0,micro_batches=1,recompute"
  "Megatron 3.6B|30,3072,32,51200,2048|64|512|2|1|138|selene|stage=0,micro_batches=1,recompute"
  "Megatron 7.5B|36,4096,32,51200,2048|128|512|4|1|142|selene|stage=0,micro_batches=1,recompute"
  "Megatron 18B|40,6144,48,51200,2048|256|1024|8|1|135|selene|stage=0,micro_batches=4,recompute"
  "Megatron 39B|48,8192,64,51200,2048|512|1536|8|2|138|selene|stage=0,micro_batches=12,schedule=1f1b,recompute"
  "Megatron 76B|60,10240,80,51200,2048|1024|1792|8|4|140|selene|stage=0,micro_batches=28,schedule=interleaved,chunks=3,recompute"
  "Megatron 145B|80,12288,96,51200,2048|1536|2304|8|8|148|selene|stage=0,micro_batches=48,schedule=interleaved,chunks=2,recompute"
  "Megatron 310B|96,16384,128,51200,2048|1920|2160|8|16|155|selene|stage=0,micro_batches=144,schedule=interleaved,chunks=2,recompute"
  "Megatron 530B|105,20480,128,51200,2048|2520|2520|8|35|163|selene|stage=0,micro_batches=280,schedule=interleaved,chunks=3,recompute"
  "Megatron 1T|128,25600,160,51200,2048|3072|3072|8|64|163|selene|stage=0,micro_batches=512,schedule=1f1b,recompute"
  "BLOOM 176B|70,14336,112,250880,2048|384|2048|4|12|150|jean_zay|stage=1,micro_batches=128,schedule=1f1b,recompute"
  "GPT-NeoX 20B|44,6144,64,50432,2048|96|1536|2|4|117|neox|stage=1,micro_batches=32,schedule=1f1b,recompute"
)

# A cluster file with the efficiency (and optionally the inter-node bandwidth) scaled.
cluster() {  # name eff inter_scale -> path
  local out="$tmp/$1-$2-$3.json"
  python3 - "$1" "$2" "$3" "$out" <<'PY'
import json, sys
name, eff, scale, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
c = json.load(open(f"docs/validation/cluster_{name}.json"))
c["matmul_efficiency"] = eff
c["inter"]["bandwidth"] *= scale
json.dump(c, open(out, "w"))
PY
  echo "$out"
}

# The paper's FLOPs per step.
flops() {  # L h V s B
  python3 -c "L,h,V,s,B=map(float,'$1 $2 $3 $4 $5'.split()); print(96*B*s*L*h*h*(1+s/(6*h)+V/(16*L*h)))"
}

step_of() { sed -n 's/.*time per step: \([0-9.]*\) ms.*/\1/p' "$1" | head -1; }
ratio() { python3 -c "print(f'{$1/$2:.3f}')" 2>/dev/null || echo "-"; }

echo "| run | GPUs | published layout (dp, tp, pp) | as run: TFLOP/s predicted / published | search | choice | step | vs as run | published pair's best | its step vs choice | pair rank |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for row in "${rows[@]}"; do
  IFS='|' read -r name shape gpus batch ptp ppp tflops cl asrun <<<"$row"
  [[ -n "$ONLY" && " $name " != *" $ONLY "* ]] && continue  # a whole word: 76B is not BLOOM 176B
  IFS=',' read -r L h a V s <<<"$shape"
  c=$(cluster "$cl" "$EFF" 1)
  args=(--auto --megatron "$shape" --cluster "$c" --world "$gpus" --batch "$batch" --dtype fp16)
  pdp=$((gpus / (ptp * ppp)))
  f=$(flops "$L" "$h" "$V" "$s" "$batch")
  # The published run as it ran.
  "$Z" "${args[@]}" --explain "dp=$pdp,tp=$ptp,pp=$ppp,$asrun" > "$tmp/asrun" 2>&1 || true
  rstep=$(step_of "$tmp/asrun")
  rpred=$(python3 -c "print(f'{$f/($rstep*1e-3)/$gpus/1e12:.0f}')" 2>/dev/null || echo "-")
  rdesc=$(sed -n 2p "$tmp/asrun")
  # The search.
  start=$(date +%s.%N)
  "$Z" "${args[@]}" --top 3 > "$tmp/choice" 2>/dev/null || true
  secs=$(python3 -c "import time; print(f'{time.time()-$start:.1f}')")
  choice=$(sed -n 's/^choice: \([^:]*\):.*/\1/p' "$tmp/choice")
  step=$(awk '$1=="1"{print $(NF-3)}' "$tmp/choice" | head -1)
  "$Z" "${args[@]}" --top 50 > "$tmp/out" 2>/dev/null || true
  # Distinct (tp, pp) pairs in rank order among the planned rows, and where the published one is.
  rank=$(python3 - "$tmp/out" "$ptp" "$ppp" <<'PY'
import re, sys
pairs = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+\d+\s+(.*?)\s{2,}", line)
    if not m or "(at least)" in line or "does not fit" in line: continue
    lay = m.group(1)
    tp = int(re.search(r"tp (\d+)", lay).group(1)) if "tp " in lay else 1
    pp = int(re.search(r"pp (\d+)", lay).group(1)) if "pp " in lay else 1
    if (tp, pp) not in pairs: pairs.append((tp, pp))
want = (int(sys.argv[2]), int(sys.argv[3]))
print(pairs.index(want) + 1 if want in pairs else f">{len(pairs)}")
PY
)
  "$Z" "${args[@]}" --tp "$ptp" --pp "$ppp" --top 1 > "$tmp/pub" 2>/dev/null || true
  pub=$(sed -n 's/^choice: \([^:]*\):.*/\1/p' "$tmp/pub"); pub=${pub:-none fits}
  pstep=$(awk '$1=="1"{print $(NF-3)}' "$tmp/pub" | head -1)
  echo "| $name | $gpus | $rdesc | $rpred / $tflops | ${secs} s | ${choice:-no layout} | $(python3 -c "print(f'{$step/1e3:.1f} s')" 2>/dev/null || echo -) | $(ratio "${step:-x}" "${rstep:-x}") | $pub | $(ratio "${pstep:-x}" "${step:-x}") | $rank |"
  if [[ "$SENS" == 1 ]]; then
    for v in "0.8 1" "1.2 1" "1 0.8" "1 1.2"; do
      read -r es bs <<<"$v"
      c2=$(cluster "$cl" "$(python3 -c "print(min(1.0, $EFF*$es))")" "$bs")
      "$Z" --auto --megatron "$shape" --cluster "$c2" --world "$gpus" --batch "$batch" --dtype fp16 --top 1 > "$tmp/s" 2>/dev/null || true
      echo "|   efficiency x$es, inter-node bandwidth x$bs | | | | | $(sed -n 's/^choice: \([^:]*\):.*/\1/p' "$tmp/s") | $(awk '$1=="1"{print $(NF-3)/1e3 " s"}' "$tmp/s" | head -1) | | | | |"
    done
  fi
done
