#!/usr/bin/env bash
# Builds the library's Debian packages (docs/install.md) into dist/ (or --out DIR):
#
#   zero_<VERSION>_<arch>.deb           libzero.so, the public headers, zeroConfig.cmake, zero.pc, and
#                                       the tools zerorun, zero_ckpt, zero_plan and calibrate_cluster
#   zero-libtorch_<VERSION>_<arch>.deb  the LibTorch adapter (libzero_torch.so, its header, the CMake
#                                       component zero::libtorch); built where libtorch-dev is
#                                       installed, unless --no-libtorch
#
# Then: apt-get install ./dist/zero_<VERSION>_amd64.deb. The version is the VERSION file's. The build
# is the CPU one (a CUDA package is not made yet: docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist libtorch=auto
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --no-libtorch) libtorch=no; shift ;;
    *) echo "package.sh: unknown argument '$1' (--out DIR, --no-libtorch)" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh --package
version=$(tr -d '[:space:]' < VERSION)
if [[ ! $version =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "package.sh: VERSION holds '$version', not MAJOR.MINOR.PATCH" >&2
  exit 1
fi
version_major=${BASH_REMATCH[1]} version_minor=${BASH_REMATCH[2]}
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)
if [[ $libtorch == auto ]]; then
  dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed" && libtorch=yes || libtorch=no
fi

targets=(//:libzero.so //comm/launch:zerorun //zero/checkpoint:zero_ckpt //tools/plan:zero_plan //tools/plan:calibrate_cluster)
config=()
if [[ $libtorch == yes ]]; then
  targets+=(//adapters/libtorch:libzero_torch.so)
  config=(--config=libtorch)
fi
echo "== bazel build ${config[*]} ${targets[*]}"
bazel build "${config[@]}" "${targets[@]}"
bin=$(bazel info "${config[@]}" bazel-bin 2>/dev/null)
soversion=$(readelf -d "$bin/libzero.so" | sed -n 's/.*(SONAME).*\[libzero\.so\.\([0-9]*\)\]/\1/p')
[[ -n $soversion ]] || { echo "package.sh: libzero.so has no soname libzero.so.N" >&2; exit 1; }
mapfile -t headers < <(bazel query 'labels(srcs, //:public_headers)' 2>/dev/null | sed 's|^//||; s|^:||; s|:|/|')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
libdir=usr/lib/$multiarch

# The template's @NAME@ fields filled in.
fill() {  # template, output
  mkdir -p "$(dirname "$2")"
  sed -e "s|@VERSION@|$version|g" -e "s|@VERSION_MAJOR@|$version_major|g" -e "s|@VERSION_MINOR@|$version_minor|g" \
      -e "s|@SOVERSION@|$soversion|g" -e "s|@MULTIARCH@|$multiarch|g" "$1" > "$2"
  chmod 644 "$2"
}
# A shared library as Debian lays it out: the file, the soname link, the development link.
install_library() {  # built .so, root, name (libzero)
  install -D -m 644 "$1" "$2/$libdir/$3.so.$version"
  strip --strip-unneeded "$2/$libdir/$3.so.$version"
  ln -s "$3.so.$version" "$2/$libdir/$3.so.$soversion"
  ln -s "$3.so.$soversion" "$2/$libdir/$3.so"
}
# The Debian packages providing the shared libraries that the given files link (dpkg-shlibdeps),
# as a Depends list; -l: folders where this build's own libraries are.
shlib_depends() {  # root, files...
  local root=$1
  shift
  mkdir -p "$work/shlibs/debian"
  printf 'Source: zero\n\nPackage: zero\nArchitecture: any\n' > "$work/shlibs/debian/control"
  (cd "$work/shlibs" && dpkg-shlibdeps -O --ignore-missing-info -l"$root/$libdir" -l"$work/zero/$libdir" \
     -xzero "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}
# DEBIAN/control and the rest, then the .deb.
build_deb() {  # root, package, depends, description
  local root=$1 package=$2 depends=$3 description=$4
  mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$package"
  install -m 644 docs/install.md "$root/usr/share/doc/$package/install.md"
  cat > "$root/DEBIAN/control" <<CONTROL
Package: $package
Version: $version
Architecture: $arch
Section: libdevel
Priority: optional
Maintainer: zero developers <zero@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Description: $description
CONTROL
  # The dynamic linker's cache learns the new libraries on install and forgets them on removal.
  echo "activate-noawait ldconfig" > "$root/DEBIAN/triggers"
  (cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
  chmod 644 "$root/DEBIAN/"*
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/${package}_${version}_${arch}.deb" >/dev/null
  echo "package.sh: $out/${package}_${version}_${arch}.deb ($(du -h "$out/${package}_${version}_${arch}.deb" | cut -f1))"
}

root=$work/zero
install_library "$bin/libzero.so" "$root" libzero
for h in "${headers[@]}"; do install -D -m 644 "$h" "$root/usr/include/zero/$h"; done
for tool in comm/launch/zerorun zero/checkpoint/zero_ckpt tools/plan/zero_plan tools/plan/calibrate_cluster; do
  install -D -m 755 "$bin/$tool" "$root/usr/bin/$(basename "$tool")"
  strip --strip-unneeded "$root/usr/bin/$(basename "$tool")"
done
# What zero_plan --model and --cluster read: the model descriptions and the hand-written clusters.
for f in examples/models/*.json; do install -D -m 644 "$f" "$root/usr/share/zero/models/$(basename "$f")"; done
for f in docs/strategy_cluster_8x80gb.json docs/strategy_cluster_64x80gb.json; do
  install -D -m 644 "$f" "$root/usr/share/zero/clusters/${f#docs/strategy_cluster_}"
done
fill tools/package/zeroConfig.cmake.in "$root/$libdir/cmake/zero/zeroConfig.cmake"
fill tools/package/zeroConfigVersion.cmake.in "$root/$libdir/cmake/zero/zeroConfigVersion.cmake"
install -d "$root/usr/lib/pkgconfig"
fill tools/package/zero.pc.in "$root/usr/lib/pkgconfig/zero.pc"
# The headers include fmt's and spdlog's, and the CMake file finds Gloo's: their -dev packages.
depends="$(shlib_depends "$root" "$root/$libdir/libzero.so.$version" "$root"/usr/bin/*), libfmt-dev, libspdlog-dev, libgloo-dev"
build_deb "$root" zero "$depends" \
  "sharded data-parallel, tensor- and pipeline-parallel training for C++
 ZeRO stages 0-3 with offload, tensor parallelism and pipeline schedules for C++ training loops,
 on Gloo (TCP) and NCCL: the shared library, its headers, CMake and pkg-config files, and the
 zerorun launcher with the checkpoint and planning tools."

if [[ $libtorch == yes ]]; then
  root=$work/zero-libtorch
  install_library "$bin/adapters/libtorch/libzero_torch.so" "$root" libzero_torch
  for h in torch_engine.h tensor_parallel.h tensor_parallel_module.h torch_pipeline.h; do
    install -D -m 644 "adapters/libtorch/$h" "$root/usr/include/zero/adapters/libtorch/$h"
  done
  fill tools/package/zero-libtorch.cmake.in "$root/$libdir/cmake/zero/zero-libtorch.cmake"
  depends="zero (= $version), $(shlib_depends "$root" "$root/$libdir/libzero_torch.so.$version"), libtorch-dev"
  build_deb "$root" zero-libtorch "$depends" \
    "the zero library's LibTorch adapter
 The engine in place of torch::optim in a LibTorch C++ training loop (zero::libtorch::TorchEngine)."
fi
