#!/usr/bin/env bash
# Multi-process Gloo tests: zerorun starts N ranks of gloo_test_worker (real processes, TCP store,
# Gloo over loopback) for each scenario. Usage: gloo_multiprocess_test.sh ZERORUN WORKER N
set -u
zerorun="$1"
worker="$2"
n="$3"
failed=0

run() {
  local name="$1"
  shift
  local out
  out=$("$zerorun" --nproc-per-node "$n" --timeout-s 50 -- "$worker" "$@" 2>&1)
  local rc=$?
  echo "---- $name ($n ranks): exit $rc"
  echo "$out"
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $name exited $rc"
    failed=1
  fi
  LAST_OUT="$out"
}

expect_lines() {
  local name="$1" pattern="$2" want="$3"
  local got
  got=$(grep -cE -- "$pattern" <<<"$LAST_OUT")
  if [[ "$got" -ne "$want" ]]; then
    echo "FAIL: $name: $got lines match '$pattern', want $want"
    failed=1
  fi
}

run suite suite --large "${LARGE:-1000003}"
expect_lines suite "\] rank [0-9]+: suite on $n ranks .*: [0-9]+ checks, 0 failures" "$n"

# Every call on the large-message path (the default sends calls of up to 256 KiB per message as one message round).
run suite-no-eager suite --large 100003 --eager-bytes 0
expect_lines suite-no-eager "\] rank [0-9]+: suite on $n ranks .*: [0-9]+ checks, 0 failures" "$n"

run die die
expect_lines die "exiting in the middle" 1
expect_lines die "\] rank [0-9]+: after [0-9.]+ s: (CommError|TimeoutError): gloo rank [0-9]+: all_reduce" "$((n - 1))"

if [[ "$n" -ge 2 ]]; then
  run mismatch mismatch
  expect_lines mismatch "\] rank [0-9]+: gloo rank [0-9]+: .*schedule mismatch: rank 0 called all_reduce\(fp32, 1024, sum\) #1 but rank 1 called all_gather\(fp32, 512\) #1" "$n"
fi

run p2p p2p --large "${LARGE:-1000003}"
expect_lines p2p "\] rank [0-9]+: p2p on $n ranks: [0-9]+ checks, 0 failures" "$n"

if [[ "$n" -ge 2 ]]; then
  run p2p-mismatch p2p-mismatch
  expect_lines p2p-mismatch "\] rank [01]: after [0-9.]+ s: .*p2p mismatch: rank 0 called send\(fp32, 100, to rank 1\) #0 \[act\] but rank 1 called recv\(fp32, 99, from rank 0\) #0 \[act\]" 2
fi

if [[ "$n" -ge 3 ]]; then
  run split split
  expect_lines split "\] rank [0-9]+: split group .*, 0 failures" "$n"
fi

if [[ $failed -ne 0 ]]; then
  echo "gloo_multiprocess_test: FAILED"
  exit 1
fi
echo "gloo_multiprocess_test: all scenarios passed on $n ranks"
