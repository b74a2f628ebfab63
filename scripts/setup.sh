#!/usr/bin/env bash
# Installs the Debian packages the build and tests need. Idempotent: installs only what is missing,
# and touches the network only when something is. With --ci (what .ci/run passes) also what CI runs
# beyond the test suite: clang, its linker and libFuzzer for scripts/fuzz.sh and the sanitizer builds,
# and libtorch-dev for the LibTorch
# adapter's tests (about 1 GB installed, so not for the README's two commands). With --package (what
# scripts/package.sh passes; --ci implies it) the tools that build and check the Debian package:
# dpkg-dev (dpkg-shlibdeps), cmake and pkgconf (the outside projects of examples/external).
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4.2.3 (WORKSPACE mode)
  bazel-rules-java     # local rules_java for the offline WORKSPACE
  g++
  libgloo-dev          # CPU collectives (TCP)
  libeigen3-dev
  libboost-dev         # Boost.Asio (header only)
  libfmt-dev
  libspdlog-dev
  doctest-dev
  nlohmann-json3-dev
  python3-yaml         # the CI recipes' check (//:workflows_test)
  python3-jsonschema
)
if [[ "${1:-}" == "--ci" ]]; then
  packages+=(clang-14 lld-14 libfuzzer-14-dev libclang-rt-14-dev libtorch-dev)
fi
if [[ "${1:-}" == "--ci" || "${1:-}" == "--package" ]]; then
  packages+=(dpkg-dev cmake pkgconf make binutils)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
