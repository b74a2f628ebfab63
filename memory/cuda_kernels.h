#pragma once
// Internal: the interface between the CUDA device (cuda_device.cc, built by the C++ compiler) and its
// kernels (cuda_kernels.cu, built by nvcc). Plain C++, no CUDA header. Arguments are validated by the
// caller (memory/op_checks.h); dtypes are fp32, fp16 or bf16.
//
// Every kernel gives the bits of memory/host_kernels.h: the conversions are base/dtype.h's integer
// round-to-nearest-even (NaN payloads included), arithmetic is one correctly rounded fp32 operation
// per element (__fadd_rn / __fmul_rn, compiled with -fmad=false), and the sums of squares use the
// same 16 double lanes and reduction tree.
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace zero::memory::cuda_kernels {

// Each launches on `stream` (a cudaStream_t) and returns the cudaError_t of the launch (0: success);
// n == 0 launches nothing. Source and destination dtypes differ for convert (a copy otherwise).
int convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream);
int convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                 size_t rows, size_t n, void* stream);
int accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, void* stream);
int scale(void* x, DType dtype, size_t n, float factor, void* stream);
int ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                size_t n, void* stream);
int block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                         void* stream);
// memory/block_quantization.h's segment of src[0, n) (blocks of `block`, int8 or int4 by `bits`,
// rounded to nearest, or stochastically where stochastic_key is nonzero); `nonfinite` (device
// memory, may be null) counts the non-finite elements.
int quantize_blocks(const void* src, DType src_dtype, size_t n, size_t block, int bits, uint64_t stochastic_key,
                    void* segment, uint64_t* nonfinite, void* stream);
int dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, size_t block, int bits,
                    void* dst, DType dst_dtype, size_t dst_stride, void* stream);

}  // namespace zero::memory::cuda_kernels
