#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds, runs every Bazel test, and ends with
#   N passed, N failed, N skipped
# derived from Bazel's per-test results. A test that needs a GPU and finds none prints the marker line
# "ZERO_TEST_SKIPPED" and exits 0; it is counted as skipped. Extra arguments go to `bazel test`
# (for example --config=asan); after `--`, target patterns to add or leave out (-//fuzz/...).
#
#   --quick   the suite without the whole-job tests (tag "e2e": training jobs under zerorun checked
#             against references, tests/BUILD), for a loop of edits; CI and the README run it whole
#
# Each phase prints its time: the setup, the build (every target the tests need), the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/testlog.sh
phase_start=$(date +%s)
phase_time() {  # prints the phase that just ended and its time
  local now
  now=$(date +%s)
  echo "-- $1: $((now - phase_start)) s"
  phase_start=$now
}
bash scripts/setup.sh || exit 1
phase_time "setup"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
opts=() patterns=()
if [[ ${1:-} == --quick ]]; then
  shift
  opts+=(--build_tests_only --test_tag_filters=-e2e)
fi
while (($#)); do
  if [[ $1 == -- ]]; then
    shift
    patterns=("$@")
    break
  fi
  opts+=("$1")
  shift
done
# The build first, on its own, so that its time is its own (the test run then finds it done).
bazel build "${opts[@]}" -- //... "${patterns[@]}" 2>&1 | tee "$log"
build_status=${PIPESTATUS[0]}
phase_time "build"
bazel test --test_summary=short "${opts[@]}" -- //... "${patterns[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
((build_status != 0 && status == 0)) && status=$build_status
phase_time "tests"

testlogs=$(bazel info bazel-testlogs "${opts[@]}" 2>/dev/null)
passed=0 failed=0 skipped=0
while read -r target result; do
  case "$result" in
    PASSED)
      if test_skipped "$testlogs" "$target"; then
        skipped=$((skipped + 1))
      else
        passed=$((passed + 1))
      fi
      ;;
    *) failed=$((failed + 1)) ;;
  esac
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE|REMOTE FAILURE)' "$log" |
  sed -E 's/\(cached\) //' | awk '{ print $1, $2 }')

# A build failure can leave tests out of the summary: never report success then.
if ((status != 0 && failed == 0)); then
  failed=1
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
((failed == 0))
