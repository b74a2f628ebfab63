#pragma once
// Run-time CPU feature detection and the SIMD path choice shared by every vectorized kernel.
//
// Kernels are compiled for several instruction sets with function target attributes and the path is
// chosen here at run time, never by -march=native at build time, so one binary runs on any x86-64.
// ZERO_SIMD=scalar|avx2|avx512 caps the path (tests use it to cover every path the machine has).
#include <string_view>
#include <vector>

namespace zero {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
};

// Detected once.
const CpuFeatures& cpu_features();

enum class SimdPath { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* simd_path_name(SimdPath path);

// Parses "scalar", "avx2", "avx512"; throws InvalidArgument otherwise.
SimdPath parse_simd_path(std::string_view name);

// Paths this CPU can run: scalar always; avx2 needs AVX2+FMA+F16C; avx512 needs AVX-512 F/BW/VL too.
std::vector<SimdPath> supported_simd_paths();

// The best supported path, capped by ZERO_SIMD when set (read once).
SimdPath best_simd_path();

}  // namespace zero
