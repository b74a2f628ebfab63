#!/usr/bin/env bash
# A unit scope or no_sync scope that is dropped unused must be a compile-time error: the scopes are
# [[nodiscard]] types, and a loop that writes `engine.gather_for_backward(u);` would otherwise end
# the scope (and mark the unit's gradients complete) before its backward ran.
set -uo pipefail
cxx=${CXX:-g++}
probe=zero/nodiscard_scope_probe.cc
flags=(-std=c++20 -fsyntax-only -Werror=unused-result -I. -DSPDLOG_FMT_EXTERNAL)

if ! out=$("$cxx" "${flags[@]}" -DHOLD "$probe" 2>&1); then
  echo "FAIL: the probe with every scope held does not compile:"; echo "$out"; exit 1
fi
for variant in DROP_UNIT DROP_NO_SYNC; do
  if out=$("$cxx" "${flags[@]}" -D"$variant" "$probe" 2>&1); then
    echo "FAIL ($variant): a dropped scope compiled"; exit 1
  fi
  if ! grep -q "lasts as long as the scope\|a unit scope ends when it is destroyed" <<<"$out"; then
    echo "FAIL ($variant): the compiler error does not carry the scope's message:"; echo "$out"; exit 1
  fi
  echo "ok ($variant): $(grep -m1 'error' <<<"$out")"
done
