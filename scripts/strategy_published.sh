#!/usr/bin/env bash
# The planner beside published 3D runs (docs/strategy.md, "Against published layouts"): Megatron-LM's
# weak-scaling rows (Narayanan et al. 2021, Table 1), BLOOM 176B and GPT-NeoX-20B, each planned on
# its cluster (docs/validation/cluster_*.json) as Megatron's GPT (zero_plan --megatron, fp16).
# Per row: the search's time (zero_plan --top 3) and its choice, the best layout with the published
# (tp, pp) and its step against the choice's, the rank of the published (tp, pp) among the distinct
# pairs of the first 50 planned layouts (a second search, not timed), and the predicted TFLOP/s per GPU in the paper's formula (96 B s l h^2 (1 + s/6h +
# V/16lh), recompute counted) beside the published. EFF=0.6 (the matmul efficiency, calibrated from
# one row); SENS=1 adds the choice with the efficiency and the bandwidth between nodes moved by 20%.
#   bash scripts/strategy_published.sh [> table.md]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //tools/plan:zero_plan >&2
Z=bazel-out/k8-opt/bin/tools/plan/zero_plan
EFF=${EFF:-0.6}
SENS=${SENS:-0}
ONLY=${ONLY:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | L,h,a,V,s | GPUs | batch | published tp | pp | TFLOP/s per GPU | cluster
rows=(
  "Megatron 1.7B|24,2304,24,51200,2048|32|512|1|1|137|selene"
  "Megatron 3.6B|30,3072,32,51200,2048|64|512|2|1|138|selene"
  "Megatron 7.5B|36,4096,32,51200,2048|128|512|4|1|142|selene"
  "Megatron 18B|40,6144,48,51200,2048|256|1024|8|1|135|selene"
  "Megatron 39B|48,8192,64,51200,2048|512|1536|8|2|138|selene"
  "Megatron 76B|60,10240,80,51200,2048|1024|1792|8|4|140|selene"
  "Megatron 145B|80,12288,96,51200,2048|1536|2304|8|8|148|selene"
  "Megatron 310B|96,16384,128,51200,2048|1920|2160|8|16|155|selene"
  "Megatron 530B|105,20480,128,51200,2048|2520|2520|8|35|163|selene"
  "Megatron 1T|128,25600,160,51200,2048|3072|3072|8|64|163|selene"
  "BLOOM 176B|70,14336,112,250880,2048|384|2048|4|12|150|jean_zay"
  "GPT-NeoX 20B|44,6144,64,50432,2048|96|1536|2|4|117|neox"
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

echo "| run | GPUs | published (tp, pp) | search | choice | step | published pair's best | its step vs choice | pair rank | TFLOP/s predicted / published |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for row in "${rows[@]}"; do
  IFS='|' read -r name shape gpus batch ptp ppp tflops cl <<<"$row"
  [[ -n "$ONLY" && " $name " != *" $ONLY "* ]] && continue  # a whole word: 76B is not BLOOM 176B
  IFS=',' read -r L h a V s <<<"$shape"
  c=$(cluster "$cl" "$EFF" 1)
  args=(--auto --megatron "$shape" --cluster "$c" --world "$gpus" --batch "$batch" --dtype fp16)
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
  f=$(flops "$L" "$h" "$V" "$s" "$batch")
  pred=$(python3 -c "print(f'{$f/($step*1e-3)/$gpus/1e12:.0f}')" 2>/dev/null || echo "-")
  vs=$(python3 -c "print(f'{$pstep/$step:.3f}')" 2>/dev/null || echo "-")
  echo "| $name | $gpus | ($ptp, $ppp) | ${secs} s | $choice | $(python3 -c "print(f'{$step/1e3:.1f} s')" 2>/dev/null || echo -) | $pub | $vs | $rank | $pred / $tflops |"
  if [[ "$SENS" == 1 ]]; then
    for v in "0.8 1" "1.2 1" "1 0.8" "1 1.2"; do
      read -r es bs <<<"$v"
      c2=$(cluster "$cl" "$(python3 -c "print(min(1.0, $EFF*$es))")" "$bs")
      "$Z" --auto --megatron "$shape" --cluster "$c2" --world "$gpus" --batch "$batch" --dtype fp16 --top 1 > "$tmp/s" 2>/dev/null || true
      echo "|   efficiency x$es, inter-node bandwidth x$bs | | | | $(sed -n 's/^choice: \([^:]*\):.*/\1/p' "$tmp/s") | $(awk '$1=="1"{print $(NF-3)/1e3 " s"}' "$tmp/s" | head -1) | | | | |"
    done
  fi
done
