#!/usr/bin/env bash
# The public header set (PUBLIC_HEADERS in the top-level BUILD) is closed: every header of this project
# that a public header includes is public too, so the installed headers never name a private one.
# Checked twice: each `#include "..."` line against the set (the error names both headers), then
# one translation unit including every public header, compiled with only a copy of the set on its
# include path (as an outside project sees the installed headers).
# Usage: public_headers_test.sh HEADER... (paths relative to the workspace root)
set -euo pipefail
(($# > 0)) || { echo "no headers given" >&2; exit 1; }
declare -A public=()
for h in "$@"; do public[$h]=1; done

status=0
for h in "$@"; do
  while read -r inc; do
    if [[ -z ${public[$inc]:-} ]]; then
      echo "FAIL: public header $h includes \"$inc\", which is not in PUBLIC_HEADERS (top-level BUILD)"
      status=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$h")
done
((status == 0)) || exit 1

include="${TEST_TMPDIR:-$(mktemp -d)}/include"
rm -rf "$include"
for h in "$@"; do
  mkdir -p "$include/$(dirname "$h")"
  cp "$h" "$include/$h"
done
tu="$include/../all_public_headers.cc"
for h in "$@"; do echo "#include \"$h\""; done > "$tu"
# spdlog as Debian's CMake and pkg-config files describe it (fmt external, compiled library).
if ! g++ -std=c++20 -fsyntax-only -Wall -Wextra -DSPDLOG_FMT_EXTERNAL -DSPDLOG_COMPILED_LIB -I"$include" "$tu"; then
  echo "FAIL: the public headers do not compile with only themselves on the include path"
  exit 1
fi
echo "OK: $# public headers, closed and compiling on their own"
