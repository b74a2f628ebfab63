# Sourced by scripts/test.sh and scripts/gpu_check.sh.
# test_skipped TESTLOGS TARGET: true when the Bazel test TARGET (//pkg:name) printed the
# ZERO_TEST_SKIPPED marker, i.e. it needed a GPU and found none.
test_skipped() {
  local path=${2#//}
  path=${path/://}
  grep -q '^ZERO_TEST_SKIPPED' "$1/$path/test.log" 2>/dev/null
}
