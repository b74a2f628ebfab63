#pragma once
// Host reduction kernels for the Gloo backend.
//
// fp16 and bf16 are reduced in fp32: each block of every source is widened to fp32, combined in
// fp32, and rounded back to 16 bits once. A sum of k fp16 values therefore rounds once instead of
// k - 1 times (what a 16-bit accumulator would do), which is what NCCL-free CPU training needs for
// gradient reduction: with fp16 accumulation 2048 + 1 + 1 + 1 stays 2048, in fp32 it is 2051 -> 2052.
// Integer sums wrap around (two's complement) instead of overflowing into undefined behavior; integer
// averages truncate toward zero (like NCCL's ncclAvg on integers).
#include <cstddef>

#include "base/dtype.h"
#include "comm/communicator.h"

namespace zero::comm {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]) for i < n, combined in source order (so
// the result is the same bits on every rank that reduces the same sources). kAvg divides the sum by
// nsrc. dst may be the same pointer as any source; other overlaps are not allowed.
void reduce_arrays(DType dtype, ReduceOp op, const void* const* srcs, size_t nsrc, void* dst,
                   size_t n);

}  // namespace zero::comm
