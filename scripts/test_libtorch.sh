#!/usr/bin/env bash
# The LibTorch adapter's tests (adapters/libtorch, examples/libtorch), built with --config=libtorch on
# Debian's libtorch-dev; ends with the line
#   N passed, N failed
# derived from Bazel's per-test results. Needs libtorch-dev installed (it is not in scripts/setup.sh:
# see docs/libtorch.md). Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ ! -f /usr/include/torch/csrc/api/include/torch/torch.h ]]; then
  echo "test_libtorch: libtorch-dev is not installed (apt-get install libtorch-dev)"
  echo "0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --config=libtorch //adapters/libtorch/... //examples/libtorch/... --test_summary=short "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

passed=0 failed=0
while read -r _ result; do
  case "$result" in
    PASSED) passed=$((passed + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE|REMOTE FAILURE|SKIPPED)' "$log" |
  sed -E 's/\(cached\) //' | awk '{ print $1, $2 }')

# A build failure can leave tests out of the summary: never report success then. Nor when nothing
# ran (a SKIPPED test above counts as failed: under this config every test must run).
if ((status != 0 && failed == 0)) || ((passed + failed == 0)); then
  failed=$((failed + 1))
fi
echo "${passed} passed, ${failed} failed"
((failed == 0))
