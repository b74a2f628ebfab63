#!/usr/bin/env bash
# Installs the Debian packages the build and tests need. Idempotent: installs only what is missing,
# and touches the network only when something is.
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
)

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
