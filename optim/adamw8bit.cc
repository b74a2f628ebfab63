#include "optim/adamw8bit.h"

#include "base/check.h"
#include "optim/dynamic_quantization.h"
#include "optim/kernels.h"

namespace zero::optim {

void adamw8bit_step(const StepInput& in, size_t n, size_t block, const StepCoeffs& coeffs, QuantizedMoment m,
                    QuantizedMoment v, SimdPath path) {
  ZERO_CHECK(block > 0 && block <= kMaxQuantBlock, "8-bit block of {} elements", block);
  const int gi = detail::grad_type_index(in.grad_dtype);
  const int oi = detail::out_type_index(in.model_out != nullptr, in.model_dtype);
  ZERO_CHECK(gi >= 0 && oi >= 0, "8-bit AdamW: unsupported gradient or model dtype");
  // The fp32 AdamW kernel of this SIMD path, run on each block's dequantized moments (L1-resident).
  const detail::StepFn fn = detail::kernel_table(path).step[static_cast<int>(OptimizerKind::kAdamW)][gi][0][oi];
  const QuantizeKernels& q = quantize_kernels(path);
  const DynamicMap& signed_map = dynamic_map(true);
  const DynamicMap& unsigned_map = dynamic_map(false);
  alignas(64) float m32[kMaxQuantBlock];
  alignas(64) float v32[kMaxQuantBlock];
  const size_t grad_size = dtype_size(in.grad_dtype);
  const size_t out_size = in.model_out != nullptr ? dtype_size(in.model_dtype) : 0;
  for (size_t at = 0, b = 0; at < n; at += block, ++b) {
    const size_t len = std::min(block, n - at);
    q.dequantize_block(signed_map, m.codes + at, len, m.absmax[b], m32);
    q.dequantize_block(unsigned_map, v.codes + at, len, v.absmax[b], v32);
    detail::StepArgs a;
    a.master = in.master + at;
    a.grad = static_cast<const char*>(in.grad) + at * grad_size;
    a.state0 = m32;
    a.state1 = v32;
    a.model_out = in.model_out != nullptr ? static_cast<char*>(in.model_out) + at * out_size : nullptr;
    a.n = len;
    a.coeffs = &coeffs;
    fn(a);
    m.absmax[b] = q.quantize_block(signed_map, m32, len, m.codes + at);
    v.absmax[b] = q.quantize_block(unsigned_map, v32, len, v.codes + at);
  }
}

}  // namespace zero::optim
