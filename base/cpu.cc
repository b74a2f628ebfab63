#include "base/cpu.h"

#include <algorithm>

#include "base/check.h"
#include "base/env.h"

namespace zero {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    // F16C has no __builtin_cpu_supports name in GCC 12: CPUID leaf 1, ECX bit 29.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
    f.f16c = (ecx >> 29) & 1u;
#endif
    return f;
  }();
  return features;
}

const char* simd_path_name(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar: return "scalar";
    case SimdPath::kAvx2: return "avx2";
    case SimdPath::kAvx512: return "avx512";
  }
  return "unknown";
}

SimdPath parse_simd_path(std::string_view name) {
  if (name == "scalar") return SimdPath::kScalar;
  if (name == "avx2") return SimdPath::kAvx2;
  if (name == "avx512") return SimdPath::kAvx512;
  ZERO_THROW(InvalidArgument, "unknown SIMD path '{}' (expected scalar, avx2 or avx512)", name);
}

std::vector<SimdPath> supported_simd_paths() {
  const CpuFeatures& f = cpu_features();
  std::vector<SimdPath> paths{SimdPath::kScalar};
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2) paths.push_back(SimdPath::kAvx2);
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl) paths.push_back(SimdPath::kAvx512);
  return paths;
}

SimdPath best_simd_path() {
  static const SimdPath path = [] {
    const auto paths = supported_simd_paths();
    SimdPath best = paths.back();
    if (const auto cap = env_get("ZERO_SIMD"); cap && !cap->empty()) {
      best = std::min(best, parse_simd_path(*cap));
    }
    return best;
  }();
  return path;
}

}  // namespace zero
