#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan) and runs each for a bounded time
# over a copy of its seed corpus and its past findings (docs/fuzzing.md).
#
#   bash scripts/fuzz.sh [TARGET...]          # all four targets, or the ones named
#   FUZZ_SECONDS=8 bash scripts/fuzz.sh       # what CI runs
#
# FUZZ_SECONDS  run time per target (default 60)
# FUZZ_JOBS     targets fuzzed at once (default: the cores, at most 4)
# FUZZ_OUT      where the builds, the working corpora, the logs and any crashing input go
#               (default $TMPDIR/zero-fuzz); the repository's corpus is never written
#
# Prints one line per target: executions, executions per second, corpus growth, peak memory. Exits
# non-zero when any target found something (a crash, a sanitizer report, an escaped exception, a
# timeout of 10 s on one input, more than 2 GB of memory), printing the saved input's path: copy it
# into fuzz/regressions/<target>/, fix the parser, and //fuzz:<target>_replay_test keeps it fixed.
#
# The targets are compiled straight from the library sources they need (listed below), not through
# Bazel: the Bazel toolchain here is gcc, and libFuzzer comes with clang.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(($(nproc) < 4 ? $(nproc) : 4))}
out=${FUZZ_OUT:-${TMPDIR:-/tmp}/zero-fuzz}
cxx=${FUZZ_CXX:-clang++-14}
all_targets=(store_wire safetensors manifest config)
targets=("${@:-${all_targets[@]}}")

# Library sources of each target (their own .cc is fuzz/<target>_fuzz.cc). The base layer goes in
# whole (every .cc in base/ but the tests), so that a new helper there (fault injection points in
# file_io, say) needs no change here; the other layers' sources are named.
base_srcs=$(find base -maxdepth 1 -name '*.cc' ! -name '*_test.cc' | sort | tr '\n' ' ')
declare -A srcs=(
  [store_wire]="comm/store/store_wire.cc"
  [safetensors]="zero/checkpoint/safetensors.cc zero/checkpoint/file_io.cc"
  [manifest]="zero/checkpoint/checkpoint_manifest.cc layout/layout.cc layout/layout_json.cc"
  [config]="zero/config/engine_config.cc zero/config/json_reading.cc zero/config/native_format.cc
            zero/config/config_validation.cc zero/config/deepspeed_format.cc zero/engine_options.cc
            layout/layout.cc layout/layout_json.cc
            zero/shard_layout.cc optim/optimizer.cc optim/loss_scaler.cc optim/step_schedule.cc optim/step_coeffs.cc
            optim/thread_pool.cc optim/kernels.cc optim/kernels_scalar.cc
            memory/tracker.cc memory/buffer.cc fuzz/simd_kernels_stub.cc"
)
# When a library gains a dependency the link fails naming the missing symbol; the sources a Bazel
# target needs are listed by
#   bazel query 'kind("source file", deps(//zero/config:engine_config))' | grep '\.cc$'
# (the AVX kernels are replaced by fuzz/simd_kernels_stub.cc, see there).
for t in "${targets[@]}"; do
  [[ -n ${srcs[$t]+x} ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (Debian: clang-14 libfuzzer-14-dev)" >&2; exit 2; }

# Objects get the sanitizers and the fuzzer's coverage (fuzzer-no-link); the link adds libFuzzer's
# main. Each source is compiled once and shared by the targets that link it (base/ by all four).
instrument=(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
link=(-fsanitize=fuzzer,address,undefined)
# nlohmann json is in /usr/include; Debian's spdlog is built against the external fmt.
cxxflags=(-std=c++20 -O1 -g -Wall -Wextra -Wno-missing-field-initializers -I. -DSPDLOG_FMT_EXTERNAL)

mkdir -p "$out/obj"
object_of() { local src=$1; echo "$out/obj/${src//\//__}.o"; }
compile() {  # source -> its object, log beside it
  local src=$1 obj
  obj=$(object_of "$src")
  "$cxx" "${cxxflags[@]}" "${instrument[@]}" -c "$src" -o "$obj" >"$obj.log" 2>&1 ||
    { cat "$obj.log" >&2; echo "fuzz.sh: compiling $src failed" >&2; return 1; }
}
link_target() {  # target -> $out/<target>/<target>_fuzz
  local t=$1 objs=()
  mkdir -p "$out/$t"
  # shellcheck disable=SC2086  # the source lists are word lists
  for src in "fuzz/${t}_fuzz.cc" ${srcs[$t]} $base_srcs; do objs+=("$(object_of "$src")"); done
  "$cxx" "${link[@]}" -o "$out/$t/${t}_fuzz" "${objs[@]}" -lspdlog -lfmt -lpthread >"$out/$t/build.log" 2>&1 ||
    { cat "$out/$t/build.log" >&2; echo "fuzz.sh: linking $t failed" >&2; return 1; }
}

run() {  # target -> exit status of libFuzzer; log in $out/<target>/fuzz.log
  local t=$1 dir=$out/$1
  rm -rf "$dir/corpus" "$dir/artifacts"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp fuzz/corpus/"$t"/* "$dir/corpus/"
  local seeds=("$dir/corpus")
  [[ -d fuzz/regressions/$t ]] && seeds+=("fuzz/regressions/$t")
  # Open findings (fuzz/open/README.md) are seeds too, so that a run fails on them at once, every
  # time, until they are fixed, rather than only when the fuzzer happens to find them again.
  [[ -d fuzz/open/$t ]] && seeds+=("fuzz/open/$t")
  local dict=()
  [[ -f fuzz/dicts/$t.dict ]] && dict=(-dict="fuzz/dicts/$t.dict")
  # New inputs go into the first corpus directory only (the copy); the others are read.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$dir/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10 \
    -print_final_stats=1 -use_value_profile=1 "${dict[@]}" -artifact_prefix="$dir/artifacts/" \
    "${seeds[@]}" >"$dir/fuzz.log" 2>&1
}

# Every source the targets need, once.
declare -A wanted=()
for t in "${targets[@]}"; do
  # shellcheck disable=SC2086
  for src in "fuzz/${t}_fuzz.cc" ${srcs[$t]} $base_srcs; do wanted[$src]=1; done
done
echo "building ${targets[*]} with $cxx into $out (${#wanted[@]} sources, $jobs at a time)" >&2
pids=()
for src in "${!wanted[@]}"; do
  compile "$src" &
  pids+=($!)
  if ((${#pids[@]} >= jobs)); then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
for t in "${targets[@]}"; do link_target "$t" || exit 1; done

echo "fuzzing each target for ${seconds} s, $jobs at a time" >&2
declare -A status
pending=("${targets[@]}")
while ((${#pending[@]} > 0)); do
  batch=("${pending[@]:0:jobs}")
  pending=("${pending[@]:jobs}")
  declare -A pid_of=()
  for t in "${batch[@]}"; do
    run "$t" &
    pid_of[$t]=$!
  done
  for t in "${batch[@]}"; do
    if wait "${pid_of[$t]}"; then status[$t]=0; else status[$t]=$?; fi
  done
  unset pid_of
done

fuzz_stat() {  # target, libFuzzer stat name -> value (or ?)
  local v
  v=$(sed -n "s/^stat::$2: *//p" "$out/$1/fuzz.log" | tail -1)
  echo "${v:-?}"
}
failed=0
for t in "${targets[@]}"; do
  seeds=$(find "fuzz/corpus/$t" -type f | wc -l)
  grown=$(find "$out/$t/corpus" -type f | wc -l)
  line=$(printf '%-12s %10s execs  %7s exec/s  corpus %3d -> %4d  peak %4s MB' "$t" \
    "$(fuzz_stat "$t" number_of_executed_units)" "$(fuzz_stat "$t" average_exec_per_sec)" "$seeds" "$grown" \
    "$(fuzz_stat "$t" peak_rss_mb)")
  if [[ ${status[$t]} -eq 0 ]]; then
    echo "$line  ok"
  else
    failed=1
    echo "$line  FINDING (libFuzzer exit ${status[$t]}), log $out/$t/fuzz.log"
    # What failed: the sanitizer's or libFuzzer's report, a broken property, an escaped exception.
    grep -E '(==ERROR|== ERROR|^SUMMARY|runtime error|fuzz property failed|^terminate called|^  what\(\))' \
      "$out/$t/fuzz.log" | head -6 | cut -c1-300 | sed 's/^/    /'
    for a in "$out/$t"/artifacts/*; do
      [[ -e $a ]] && echo "    input: $a"
    done
  fi
done
exit $failed
