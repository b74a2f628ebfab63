#!/usr/bin/env bash
# The main job: trains the example MLP on 2 local ranks with the sharded engine and prints the loss
# per step and every rank's memory report. Installs what is missing first. Extra arguments go to the
# training program (e.g. --stage 1 --steps 50 --deterministic); NPROC overrides the rank count.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel build //comm/launch:zerorun //examples:train_mlp
exec bazel-bin/comm/launch/zerorun --nproc-per-node "${NPROC:-2}" -- bazel-bin/examples/train_mlp "$@"
