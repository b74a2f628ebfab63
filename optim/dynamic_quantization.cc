#include "optim/dynamic_quantization.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace zero::optim {
namespace {

DynamicMap build(bool is_signed) {
  // 10^(i-6) as literals, so no pow() rounding enters.
  static constexpr double kScale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? (1 << i) : (1 << (i + 1));  // values in this decade
    for (int k = 0; k < n; ++k) {
      const double lo = 0.1 + (1.0 - 0.1) * k / n, hi = 0.1 + (1.0 - 0.1) * (k + 1) / n;
      const double mean = (lo + hi) / 2.0;
      v.push_back(kScale[i] * mean);
      if (is_signed) v.push_back(-(kScale[i] * mean));
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  std::sort(v.begin(), v.end());
  DynamicMap map{};
  for (size_t k = 0; k < 256; ++k) map.values[k] = static_cast<float>(v[k]);
  for (size_t k = 0; k < 255; ++k) map.midpoints[k] = (map.values[k] + map.values[k + 1]) * 0.5f;
  map.midpoints[255] = std::numeric_limits<float>::infinity();
  for (int d = 0; d < 8; ++d) {
    for (int j = 0; j < (1 << d); ++j) map.pivots[d][j] = map.midpoints[(j << (8 - d)) + (1 << (7 - d)) - 1];
  }
  return map;
}

}  // namespace

const DynamicMap& dynamic_map(bool is_signed) {
  static const DynamicMap signed_map = build(true), unsigned_map = build(false);
  return is_signed ? signed_map : unsigned_map;
}

float quantize_block(const DynamicMap& map, const float* x, size_t n, uint8_t* codes) {
  float absmax = 0.0f;
  for (size_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  quantize_with(map, x, n, absmax, codes);
  return absmax;
}

void quantize_with(const DynamicMap& map, const float* x, size_t n, float absmax, uint8_t* codes) {
  const float scale = absmax > 0.0f ? absmax : 1.0f;
  for (size_t i = 0; i < n; ++i) codes[i] = quantize_code(map, x[i] / scale);
}

void dequantize_block(const DynamicMap& map, const uint8_t* codes, size_t n, float absmax, float* values) {
  for (size_t i = 0; i < n; ++i) values[i] = map.values[codes[i]] * absmax;
}

namespace detail {
const QuantizeKernels* quantize_kernels_avx2();    // dynamic_quantization_avx2.cc
const QuantizeKernels* quantize_kernels_avx512();  // dynamic_quantization_avx512.cc
}

const QuantizeKernels& quantize_kernels(SimdPath path) {
  static const QuantizeKernels scalar{&quantize_block, &dequantize_block};
  if (path == SimdPath::kAvx512) return *detail::quantize_kernels_avx512();
  if (path == SimdPath::kAvx2) return *detail::quantize_kernels_avx2();
  return scalar;
}

}  // namespace zero::optim
