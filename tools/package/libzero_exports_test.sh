#!/usr/bin/env bash
# libzero.so's dynamic symbol table holds the library's namespace and nothing of what it compiles in
# from its private dependencies (Boost.Asio, Eigen, nlohmann::json, std templates): libzero.lds. A
# symbol outside zero:: fails the test, named. Also: the soname is libzero.so.<ABI>, and no symbol is
# left undefined that the listed shared libraries do not provide (linked with --no-undefined).
# Usage: libzero_exports_test.sh path/to/libzero.so
set -euo pipefail
lib=$1
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [[ ! $soname =~ ^libzero\.so\.[0-9]+$ ]]; then
  echo "FAIL: soname '$soname' is not libzero.so.<ABI number>"
  exit 1
fi
defined=$(nm -DC --defined-only "$lib" | cut -d' ' -f3-)
total=$(wc -l <<<"$defined")
# Demangled names of the library's own: zero::..., and the ABI's extras for its classes.
own='^(zero::|(typeinfo|typeinfo name|vtable|VTT|guard variable) for zero::|(non-virtual |virtual )?thunk to zero::)'
foreign=$(grep -Ev "$own" <<<"$defined" || true)
if [[ -n $foreign ]]; then
  echo "FAIL: libzero.so exports symbols outside the library's namespace:"
  head -40 <<<"$foreign"
  exit 1
fi
if ((total < 100)); then
  echo "FAIL: libzero.so exports only $total symbols: were its dependencies' objects linked in?"
  exit 1
fi
echo "OK: $soname exports $total symbols, all in namespace zero"
