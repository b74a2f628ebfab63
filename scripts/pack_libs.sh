#!/usr/bin/env bash
# Copies into DIR/lib the shared libraries that the programs in DIR load, for a machine that runs
# them but cannot install Debian's packages (no network there): all but those every Linux has (the C
# and C++ runtimes, the loader) and those whose names match SKIP (an extended regular expression
# over sonames: the libraries the other machine brings itself, its GPU driver's say).
#
#   bash scripts/pack_libs.sh DIR [SKIP]
#
# Run the programs there with LD_LIBRARY_PATH=DIR/lib. Prints the packed libraries' count and size.
set -euo pipefail
dir=${1:?usage: pack_libs.sh DIR [SKIP]}
skip=${2:-}
base='^(linux-vdso|libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|ld-linux-x86-64)\.so'
mkdir -p "$dir/lib"
for f in "$dir"/*; do
  [[ -f $f && -x $f ]] || continue
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $base ]] && continue
  [[ -n $skip && $name =~ $skip ]] && continue
  cp -L "$path" "$dir/lib/$name"
done
echo "pack_libs: $(find "$dir/lib" -type f | wc -l) libraries, $(du -sk "$dir/lib" | cut -f1) KiB, in $dir/lib"
