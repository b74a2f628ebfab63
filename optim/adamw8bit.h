#pragma once
// 8-bit AdamW (Dettmers et al., arXiv 2110.02861): AdamW whose two moments are stored block-wise
// quantized (optim/dynamic_quantization.h: the signed map for exp_avg, the unsigned one for
// exp_avg_sq), one fp32 absmax per block per moment. Per block and step:
//
//   m, v  = the block's moments, dequantized to fp32
//   p, m, v = torch.optim.AdamW's update (the same kernels and bits as optim::Optimizer's AdamW)
//   m, v  = quantized again, each with the new block's absmax
//
// The fp32 master and the parameter update use the fresh fp32 moments; only what is kept between
// steps is 8-bit (as bitsandbytes' blockwise kernels do). A block is `block` elements of the whole
// tensor counted from its first element (the last block of a tensor may be shorter), so the state
// does not depend on how the tensor is sharded.
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"
#include "optim/optimizer.h"
#include "optim/step_coeffs.h"

namespace zero::optim {

// The largest block (OptimizerOptions::quant_block's bound): two blocks of fp32 moments sit on the
// stack while a block is updated.
inline constexpr size_t kMaxQuantBlock = 4096;

// One moment's quantized state: a code per element, an absmax per block.
struct QuantizedMoment {
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
};

// One step over n elements that start on a block boundary of their tensor: blocks of `block`
// elements (the last one may be shorter). `in`'s pointers address the first element (its grad_scale
// is `coeffs`' grad_scale); `coeffs` are compute_step_coeffs(kAdamW8bit, ...)'s.
void adamw8bit_step(const StepInput& in, size_t n, size_t block, const StepCoeffs& coeffs, QuantizedMoment m,
                    QuantizedMoment v, SimdPath path);

}  // namespace zero::optim
