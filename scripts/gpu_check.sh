#!/usr/bin/env bash
# The GPU checks, in two halves, for a GPU machine that cannot build (no network, no Bazel there):
#
#   bash scripts/gpu_check.sh build [DIR]  here (nvcc installed): builds the CUDA configuration's GPU
#                                          tests and benchmark with -c opt, our code linked statically,
#                                          strips them and packs them with their shared libraries (but
#                                          for libc, libstdc++, the driver and NCCL) and this script
#                                          into DIR (default gpu_pack/, ignored by git), which must stay
#                                          under 64 MiB.
#   bash DIR/gpu_check.sh run [DIR]        there: runs every step with a 50 s timeout (90 s under
#                                          compute-sanitizer; steps left at 7 minutes are skipped, so
#                                          the whole stays under 8), prints what each did and one
#                                          summary line.
#   bash scripts/gpu_check.sh              both, on one machine with a GPU and Bazel.
#
# A step that needs a GPU and finds none says it skipped and why, so `run` on a machine without a GPU
# is the dry run: it shows every step it would take. With a GPU present, a step that skips where one
# GPU is enough is a failure; the NCCL test's two-rank cases need two GPUs and are reported as
# skipped, with the count of GPUs seen, where there is one. On a 2-GPU runner (the CI the library's
# users run) the same command runs them too. The packed binaries need the GPU machine's driver
# (libcuda.so.1), NCCL (libnccl.so.2, 200 MiB) and cuBLAS (libcublas.so, libcublasLt.so, 600 MiB):
# those are not packed. Where the loader does not find them, `run` looks in the usual places (a
# Python environment's nvidia-* wheels among them) and says what it used; a step whose libraries
# are still missing fails and names them.
#
# Where the GPU machine has NVIDIA's compute-sanitizer, the kernel and engine tests run again under
# it: memcheck (out-of-bounds and misaligned device accesses, device memory leaked at exit) and
# racecheck (shared-memory races in the reduction kernels). A machine without it skips those steps
# and says so; a report from the tool fails its step.
set -uo pipefail

mode=${1:-all}
here=$(cd "$(dirname "$0")" && pwd)

# name | binary and arguments | what it shows | may skip with one GPU (the multi-rank cases) |
# compute-sanitizer tool to run it under (none: plain)
steps=(
  "memory kernels|cuda_test|the CUDA layer: streams, events, timeouts, errors|no"
  "CUDA device|cuda_device_test|the Device's kernels against the host path, bit for bit|no"
  "optimizer kernels|multi_tensor_step_test|the multi-tensor step against the CPU optimizer, bit for bit|no"
  "CUDA optimizer|cuda_optimizer_test|the shard optimizer on the GPU against the CPU one|no"
  "NCCL communicator|nccl_communicator_test|collectives, the deferred schedule check, errors; 2-rank cases need 2 GPUs|yes"
  "engine on CUDA|engine_cuda_test|stages 0-3 on CUDA + NCCL against the host + Gloo, offload, checkpoints, host waits counted|no"
  "optimizer speed|gpu_optim_bench|AdamW's GB/s against the device's copy bandwidth|no"
  "CUDA example|cuda_mlp_test|the MLP on cuBLAS at stages 0-3 against the host MLP's loss curve|no"
  "step times|train_mlp_cuda --stages 0,1,2,3 --steps 20|the CUDA MLP's mean step time at stages 0-3|no"
  "memcheck: CUDA device|cuda_device_test|the Device's kernels' accesses|no|memcheck"
  "memcheck: optimizer kernels|multi_tensor_step_test|the multi-tensor step's accesses|no|memcheck"
  "memcheck: CUDA optimizer|cuda_optimizer_test|the shard optimizer's accesses|no|memcheck"
  "memcheck: engine on CUDA|engine_cuda_test|the engine's copies, kernels and NCCL buffers|no|memcheck"
  "memcheck: CUDA example|cuda_mlp_test|the MLP's kernels and cuBLAS calls|no|memcheck"
  "racecheck: CUDA device|cuda_device_test|shared memory in the Device's reductions|no|racecheck"
  "racecheck: optimizer kernels|multi_tensor_step_test|shared memory in the norm's lane tree|no|racecheck"
)
targets=(//memory:cuda_test //memory:cuda_device_test //optim/cuda:multi_tensor_step_test
         //optim/cuda:cuda_optimizer_test //comm/nccl:nccl_communicator_test //zero:engine_cuda_test
         //optim/cuda:gpu_optim_bench //examples/cuda:cuda_mlp_test //examples/cuda:train_mlp_cuda)

build() {
  local dir=$1
  cd "$here/.." || exit 1
  bash scripts/setup.sh || exit 1
  [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "gpu_check build: no nvcc at /usr/local/cuda/bin: install the CUDA toolkit" >&2; exit 1; }
  echo "== bazel build --config=cuda -c opt --dynamic_mode=off ${targets[*]}"
  bazel build --config=cuda -c opt --dynamic_mode=off "${targets[@]}" || exit 1
  local bin
  bin=$(bazel info --config=cuda -c opt --dynamic_mode=off bazel-bin 2>/dev/null) || exit 1
  rm -rf "$dir" && mkdir -p "$dir/lib" || exit 1
  for t in "${targets[@]}"; do
    local path=${t#//}
    path=${path/://}
    install -m 755 "$bin/$path" "$dir/" || exit 1
    strip --strip-all "$dir/$(basename "$path")"
  done
  # Not the driver (libcuda), NCCL and cuBLAS (200 and 600 MiB): the GPU machine's own; the rest
  # (Gloo, fmt, spdlog and theirs) it may lack and cannot install.
  bash "$here/pack_libs.sh" "$dir" '^(libcuda|libnccl|libcublas|libcublasLt)\.so' || exit 1
  install -m 755 "$here/gpu_check.sh" "$dir/gpu_check.sh"
  git rev-parse HEAD > "$dir/COMMIT" 2>/dev/null
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  echo "gpu_check build: packed $(ls "$dir" | wc -l) files, $((kib / 1024)) MiB, into $dir"
  ((kib < 64 * 1024)) || { echo "gpu_check build: $dir is over 64 MiB" >&2; exit 1; }
}

# The libraries the pack leaves to the machine (NCCL, cuBLAS) that the loader cannot find, looked
# for where a machine without them installed system-wide often has them: a Python environment's
# nvidia-* wheels (PyTorch's images), /opt, /usr/local. Each folder found joins LD_LIBRARY_PATH.
find_missing_libraries() {
  local name found
  for name in $(for f in ./*; do [[ -f $f && -x $f ]] && ldd "$f" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /opt /usr/local /usr/lib /usr/lib64 "$HOME/.local" -name "$name" 2>/dev/null | head -n 1)
    if [[ -n $found ]]; then
      echo "gpu_check run: $name from $(dirname "$found")"
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
    fi
  done
}

run() {
  local dir=$1
  cd "$dir" || { echo "gpu_check run: no folder $dir (run the build half first)" >&2; exit 1; }
  export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  find_missing_libraries
  local gpus=0
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    nvidia-smi -L
  fi
  echo "gpu_check run: $gpus GPU(s) visible; packed from commit $(cat COMMIT 2>/dev/null || echo unknown)"
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  local passed=0 failed=0 skipped=0 start=$SECONDS
  mkdir -p logs
  for s in "${steps[@]}"; do
    local tool=
    IFS='|' read -r name command what multi tool <<<"$s"
    local binary=${command%% *} args=
    [[ $command == *" "* ]] && args=${command#* }
    local log="logs/$binary${tool:+.$tool}.log" limit=50 wrapper=()
    if ((SECONDS - start > 420)); then
      echo "SKIPPED  $name: the run is past 7 minutes"
      skipped=$((skipped + 1))
      continue
    fi
    if [[ -n $tool ]]; then
      if [[ -z $sanitizer ]]; then
        echo "SKIPPED  $name: no compute-sanitizer on this machine"
        skipped=$((skipped + 1))
        continue
      fi
      limit=90
      # API errors are not reported: the tests provoke some on purpose (an allocation past the
      # device's memory) and NCCL probes for kernel images it may lack; our code checks every call.
      wrapper=("$sanitizer" --tool "$tool" --error-exitcode 86 --report-api-errors no)
      [[ $tool == memcheck ]] && wrapper+=(--leak-check full)
    fi
    if [[ ! -x $binary ]]; then
      echo "FAILED   $name: $binary is not in the pack"
      failed=$((failed + 1))
      continue
    fi
    local missing
    missing=$(ldd "./$binary" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
    if ((gpus == 0)); then
      echo "SKIPPED  $name ($binary: $what): no GPU visible (nvidia-smi lists none)${missing:+; it would also miss: $missing}"
      skipped=$((skipped + 1))
      continue
    fi
    if [[ -n $missing ]]; then
      echo "FAILED   $name: missing libraries: $missing"
      failed=$((failed + 1))
      continue
    fi
    local t0=$SECONDS status
    # shellcheck disable=SC2086  # the arguments are words
    timeout "$limit" "${wrapper[@]}" "./$binary" $args >"$log" 2>&1
    status=$?
    local took=$((SECONDS - t0))
    if ((status != 0)); then
      local why="exit $status"
      ((status == 86)) && why="compute-sanitizer $tool reported errors"
      ((status == 124)) && why="timed out"
      echo "FAILED   $name: $why after $took s; the end of $dir/$log:"
      tail -n 20 "$log" | sed 's/^/    /'
      failed=$((failed + 1))
    elif grep -q '^ZERO_TEST_SKIPPED' "$log"; then
      local why
      why=$(grep '^ZERO_TEST_SKIPPED' "$log" | sort -u | sed 's/^ZERO_TEST_SKIPPED: //' | paste -sd ';' -)
      if [[ $multi == yes ]] && ((gpus < 2)) && ! grep '^ZERO_TEST_SKIPPED' "$log" | grep -qv "needs 2 CUDA device"; then
        echo "PASSED   $name ($took s); the 2-rank cases skipped on $gpus GPU: $why"
        passed=$((passed + 1))
      else
        echo "FAILED   $name: skipped on a GPU machine: $why"
        failed=$((failed + 1))
      fi
    else
      echo "PASSED   $name ($took s)"
      passed=$((passed + 1))
    fi
    if [[ $binary == gpu_optim_bench || $binary == train_mlp_cuda ]]; then grep '^|' "$log" | sed 's/^/    /'; fi
  done
  echo "gpu_check: $passed passed, $failed failed, $skipped skipped in $((SECONDS - start)) s"
  ((failed == 0))
}

case $mode in
  build) build "${2:-$here/../gpu_pack}" ;;
  run) run "${2:-$here}" ;;
  all)
    build "$here/../gpu_pack" && run "$here/../gpu_pack"
    ;;
  *)
    echo "usage: bash scripts/gpu_check.sh [build [DIR] | run [DIR]]" >&2
    exit 2
    ;;
esac
