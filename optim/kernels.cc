#include "optim/kernels.h"

#include "base/check.h"

namespace zero::optim::detail {

const KernelTable& kernel_table(SimdPath path) {
  bool supported = false;
  for (SimdPath p : supported_simd_paths()) supported |= (p == path);
  if (!supported) {
    ZERO_THROW(InvalidArgument, "simd_path: {} is not supported by this CPU", simd_path_name(path));
  }
  switch (path) {
    case SimdPath::kAvx512: return kernels_avx512();
    case SimdPath::kAvx2: return kernels_avx2();
    case SimdPath::kScalar: break;
  }
  return kernels_scalar();
}

}  // namespace zero::optim::detail
