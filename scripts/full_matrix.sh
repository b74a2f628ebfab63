#!/usr/bin/env bash
# Runs the test matrices whole (layouts x stages x schedules x flags): the suite runs a covering
# subset of each (testing/matrix.h), this every combination. Extra arguments go to `bazel test`
# (--config=asan, say). Prints Bazel's summary; its result goes in the note of the change.
#
#   bash scripts/full_matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(//tests:gpt_reference_test //tests:compose_dp2_pp2_test //tests:compose_dp2_tp2_test
         //tests:compose_dp2_tp2_pp2_test)
bazel test --test_env=ZERO_FULL_MATRIX=1 --test_summary=short "$@" -- "${targets[@]}"
# The LibTorch GPT against Python PyTorch, and its 200-step checkpoint across layouts, where
# libtorch-dev is installed (its own configuration).
if [[ -f /usr/include/torch/csrc/api/include/torch/torch.h ]]; then
  bazel test --config=libtorch --test_env=ZERO_FULL_MATRIX=1 --test_summary=short "$@" -- //examples/libtorch:torch_gpt_test \
    //examples/libtorch:train_torch_gpt_test
fi
