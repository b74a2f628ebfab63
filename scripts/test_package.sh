#!/usr/bin/env bash
# The installable library, checked as a user outside this tree meets it (docs/install.md):
#   1. scripts/package.sh builds the .deb files;
#   2. they are unpacked with dpkg-deb -x into a scratch folder (not installed), and the unpacked
#      libzero.so is checked: soname, and namespace zero only in its dynamic symbols; the unpacked
#      zero_plan plans a packaged model description on a packaged cluster, and on this machine as
#      the packaged calibrate_cluster measures it (2 ranks);
#   3. examples/external/cmake (find_package(zero)) is configured and built against the scratch
#      copy, with no include path into this source tree, and trains on 2 ranks under the packaged
#      zerorun;
#   4. examples/external/make (pkg-config --define-prefix) is built and trains on 2 ranks;
#   5. examples/external/libtorch (find_package(Torch), find_package(zero COMPONENTS libtorch)) is
#      built and trains on 2 ranks, where libtorch-dev is installed (else counted as skipped).
# Ends with "N passed, N failed, N skipped" (the checks above). Keeps nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

passed=0 failed=0 skipped=0
check() {  # name, status
  if (($2 == 0)); then
    passed=$((passed + 1)); echo "package check: $1: OK"
  else
    failed=$((failed + 1)); echo "package check: $1: FAILED"
  fi
}
finish() {
  echo "${passed} passed, ${failed} failed, ${skipped} skipped"
  ((failed == 0))
  exit
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
root=$scratch/root
lib=$root/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
version=$(tr -d '[:space:]' < VERSION)

# 1, 2.
bash scripts/package.sh --out "$scratch/dist" 2>&1 | grep -v '^INFO: \|^Loading\|^Analyzing'
check "scripts/package.sh" "${PIPESTATUS[0]}"
mkdir -p "$root"
status=0
for deb in "$scratch"/dist/*.deb; do dpkg-deb -x "$deb" "$root" || status=1; done
[[ -f $lib/libzero.so.$version ]] || status=1
check "dpkg-deb -x into a scratch folder" "$status"
((status == 0)) || finish
bash tools/package/libzero_exports_test.sh "$lib/libzero.so.$version"
check "the packaged libzero.so's soname and exports" $?
# The packaged planner on a packaged model description and cluster.
share=$root/usr/share/zero
LD_LIBRARY_PATH=$lib timeout 120 "$root/usr/bin/zero_plan" --auto --model "$share/models/llama2_7b.json" --batch 256 \
  --cluster "$share/clusters/8x80gb.json" --top 3 > "$scratch/plan.log" 2>&1 && grep "^choice: " "$scratch/plan.log"
check "zero_plan plans the packaged LLaMA-2 7B on the packaged 8 x 80 GB cluster" $?
# The packaged calibration of this machine, and the planner on it.
LD_LIBRARY_PATH=$lib timeout 120 "$root/usr/bin/zerorun" --nproc-per-node 2 -- "$root/usr/bin/calibrate_cluster" \
  --repeats 1 --out "$scratch/machine.json" > "$scratch/calibrate.log" 2>&1 &&
  LD_LIBRARY_PATH=$lib timeout 120 "$root/usr/bin/zero_plan" --auto --model "$share/models/gpt_4layer.json" --batch 16 \
    --world 2 --cluster "$scratch/machine.json" --top 3 >> "$scratch/calibrate.log" 2>&1 &&
  grep "^choice: " "$scratch/calibrate.log" || tail -20 "$scratch/calibrate.log"
check "calibrate_cluster measures this machine on 2 ranks and zero_plan plans the packaged GPT on it" $?

# Copies of the projects, built outside the tree. Every include path a build uses must lie outside
# this source tree: the packaged headers, or the system's.
cp -r examples/external "$scratch/src"
no_tree_includes() {  # compile command lines on stdin
  local leaks
  leaks=$(grep -oE -- "(-I|-isystem ?)$repo[^ \"]*" || true)
  [[ -z $leaks ]] || { echo "include paths into the source tree: $leaks"; return 1; }
}
# The loss at the last step below half the first step's: it trained.
trained() {  # log
  awk '/step +[0-9]+ +loss/ { for (i = 1; i < NF; ++i) if ($i == "loss") loss = $(i + 1); if (!first) first = loss }
       END { exit !(first && loss < first / 2) }' "$1" ||
    { echo "the loss did not fall by half:"; grep -E 'step +[0-9]+ +loss' "$1" | sed -n '1p;$p'; return 1; }
}
run_2_ranks() {  # log, program and arguments
  local log=$1
  shift
  LD_LIBRARY_PATH=$lib timeout 120 "$root/usr/bin/zerorun" --nproc-per-node 2 -- "$@" > "$log" 2>&1 ||
    { tail -20 "$log"; return 1; }
  sed -n '1,2p;$p' "$log"
}

# A CMake project of examples/external configured, built against the scratch copy, and trained on 2
# ranks.
cmake_project() {  # folder, what it finds, program, its arguments...
  local folder=$1 finds=$2 program=$3
  shift 3
  local build=$scratch/build-$folder log=$scratch/$folder.log
  if cmake -S "$scratch/src/$folder" -B "$build" -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
       -DCMAKE_BUILD_TYPE=Release > "$log" 2>&1 &&
     cmake --build "$build" >> "$log" 2>&1 && no_tree_includes < "$build/compile_commands.json"; then
    check "examples/external/$folder builds ($finds)" 0
    run_2_ranks "$scratch/$folder-run.log" "$build/$program" "$@" && trained "$scratch/$folder-run.log"
    check "examples/external/$folder trains on 2 ranks ($*)" $?
  else
    tail -30 "$log"
    check "examples/external/$folder builds ($finds)" 1
  fi
}

# 3. CMake.
cmake_project cmake "find_package(zero)" train_mlp --stage 3 --steps 40

# 4. make + pkg-config.
if PKG_CONFIG_PATH=$root/usr/lib/pkgconfig make -C "$scratch/src/make" PKG_CONFIG="pkg-config --define-prefix" \
     > "$scratch/make.log" 2>&1 && no_tree_includes < "$scratch/make.log"; then
  check "examples/external/make builds (pkg-config)" 0
  run_2_ranks "$scratch/make-run.log" "$scratch/src/make/train_mlp" --stage 1 --steps 40 && trained "$scratch/make-run.log"
  check "examples/external/make trains on 2 ranks (--stage 1 --steps 40)" $?
else
  tail -30 "$scratch/make.log"
  check "examples/external/make builds (pkg-config)" 1
fi

# 5. LibTorch.
if [[ -f $lib/libzero_torch.so.$version ]]; then
  cmake_project libtorch "find_package(Torch), find_package(zero COMPONENTS libtorch)" train_torch --stage 3 --steps 30
else
  echo "package check: examples/external/libtorch: SKIPPED (no libtorch-dev here, so no zero-libtorch package)"
  skipped=$((skipped + 1))
fi
finish
