#!/usr/bin/env bash
# The GPU checks, for a machine with a CUDA device (CI has none): builds the CUDA configuration and
# runs the tests that skip without a device, failing if any of them still skips. Keep it under about
# 8 minutes: it is meant for a short, borrowed GPU session.
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/testlog.sh
bash scripts/setup.sh || exit 1
nvidia-smi -L || { echo "gpu_check: no GPU visible" >&2; exit 1; }

tests=(
  //memory:cuda_test
  //memory:cuda_device_test
  //optim/cuda:multi_tensor_step_test
  //optim/cuda:cuda_optimizer_test
  //comm/nccl:nccl_communicator_test
  //zero:engine_cuda_test
)
bazel test --config=cuda --test_output=all "${tests[@]}" 2>&1 | tee /tmp/zero_gpu_check.log
status=${PIPESTATUS[0]}
testlogs=$(bazel info bazel-testlogs --config=cuda 2>/dev/null)
for t in "${tests[@]}"; do
  if test_skipped "$testlogs" "$t"; then
    echo "gpu_check: $t skipped on a GPU machine" >&2
    status=1
  fi
done
exit "$status"
