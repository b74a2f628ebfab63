// For scripts/fuzz.sh's clang build of the config target only (Bazel builds the real kernels).
// engine_config links the optimizer, whose AVX2 and AVX-512 kernel files are compiled with
// `#pragma GCC target`, which clang does not honour. The config parser never runs an optimizer
// step, so both wide paths hand back the scalar table: nothing the target executes changes.
#include "optim/kernels.h"

namespace zero::optim::detail {

const KernelTable& kernels_avx2() { return kernels_scalar(); }
const KernelTable& kernels_avx512() { return kernels_scalar(); }

}  // namespace zero::optim::detail
