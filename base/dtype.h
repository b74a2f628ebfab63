#pragma once
// Element types and 16-bit float conversion.
//
// fp16 and bf16 values are stored as raw uint16_t bit patterns (types Half and BFloat16 below wrap them
// for overloads). The scalar conversions are in base/float16.h (shared with the CUDA kernels); the
// array converters here are vectorized (F16C / AVX-512) with the path chosen at run time and give the
// same bits as the scalar functions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "base/cpu.h"
#include "base/float16.h"  // the scalar conversions

namespace zero {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kUInt8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Accepts the names dtype_name prints ("fp32", "fp16", "bf16", "fp64", "int32", "int64", "uint8").
DType parse_dtype(std::string_view name);
inline bool is_float16_family(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// Storage wrappers so 16-bit floats can be told apart in templates and overloads.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<Half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::kBFloat16; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kUInt8; }

// ---- array conversions (vectorized; the path defaults to best_simd_path()) ----

void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n);
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n);
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n);

// The same with an explicit path (tests cover every path). The path must be supported.
void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n, SimdPath path);
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path);
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n, SimdPath path);
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path);

}  // namespace zero
