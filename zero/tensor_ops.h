#pragma once
// Element-wise helpers over flat buffers of fp32/fp16/bf16, used by the engine to move gradients
// between the user's dtype, the reduction dtype and the accumulators. 16-bit values are widened to
// fp32 for arithmetic and rounded to nearest even once on the way back.
#include <cstddef>

#include "base/dtype.h"

namespace zero {

// dst[i] = src[i], converting dtypes (memcpy when they match).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
// dst[i] += src[i] in fp32 arithmetic.
void accumulate_elements(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);
// out[i] = in_0[i] + in_1[i] + ... + in_{k-1}[i], summed left to right in fp32 (so the result does
// not depend on how the inputs were produced), written in out_dtype. `ins` are k buffers `stride`
// elements apart in one allocation of in_dtype.
void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                 size_t n);
void zero_elements(void* dst, DType dtype, size_t n);
// Byte address of element i.
inline void* element_ptr(void* base, DType dtype, size_t i) {
  return static_cast<char*>(base) + i * dtype_size(dtype);
}
inline const void* element_ptr(const void* base, DType dtype, size_t i) {
  return static_cast<const char*>(base) + i * dtype_size(dtype);
}

}  // namespace zero
