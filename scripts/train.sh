#!/usr/bin/env bash
# The main job: trains the GPT example (byte-level, on the licence texts of /usr/share/common-licenses)
# on 2 local ranks at stage 3 and prints per step the loss, the learning rate, tokens/s, the step time
# and its split, and memory; the validation loss; every rank's memory report; and a sample. Installs
# what is missing first. Extra arguments go to the training program (e.g. --stage 2 --steps 1000
# --deterministic); NPROC overrides the rank count. The minimal MLP example:
# bazel-bin/examples/train_mlp under the same launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The build in one line: its log is kept (and named) only where it failed or warned.
echo "train.sh: building the launcher and train_gpt (bazel build -c opt --config=native; minutes the first time)"
log=$(mktemp /tmp/zero_train_build.XXXXXX.log)
start=$(date +%s)
if ! bazel build -c opt --config=native //comm/launch:zerorun //examples/gpt:train_gpt >"$log" 2>&1; then
  tail -n 80 "$log"
  echo "train.sh: the build failed (whole log: $log)" >&2
  exit 1
fi
warnings=$(grep -c "warning:" "$log" || true)
if ((warnings > 0)); then
  echo "train.sh: built in $(($(date +%s) - start)) s with $warnings compiler warnings (log: $log)"
else
  echo "train.sh: built in $(($(date +%s) - start)) s"
  rm -f "$log"
fi
exec bazel-bin/comm/launch/zerorun --nproc-per-node "${NPROC:-2}" -- bazel-bin/examples/gpt/train_gpt "$@"
