#pragma once
// The optimizer step on CUDA devices, multi-tensor style: one kernel launch updates a whole list of
// device ranges (shards, or the segments of a shard), each with its own group's coefficients.
//
// The update code is the CPU kernels' (optim/updates.inc) compiled with CUDA's correctly rounded
// intrinsics (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn, __fmaf_rn where PyTorch fuses) and
// -fmad=false, so for the same inputs and StepCoeffs the results equal the CPU path's bit for bit
// (fp32, and the RNE-rounded fp16/bf16 state and copy-out; NaN payloads of a fp16 copy-out may
// differ). This header needs no CUDA header; in CPU builds the function is not linked in.
#include <cstddef>
#include <span>

#include "base/dtype.h"
#include "optim/optimizer_kind.h"
#include "optim/step_coeffs.h"

namespace zero::optim::cuda {

// One contiguous range in device memory; every pointer addresses the range's first element.
struct DeviceRange {
  float* master = nullptr;      // n fp32 master weights, updated in place
  const void* grad = nullptr;   // n gradients of DeviceStepConfig::grad_dtype
  void* state0 = nullptr;       // exp_avg / momentum_buffer / sum (see Optimizer::state_names())
  void* state1 = nullptr;       // exp_avg_sq (Adam, AdamW)
  void* model_out = nullptr;    // n values of model_dtype when DeviceStepConfig::copy_out
  size_t n = 0;
  StepCoeffs coeffs;  // compute_step_coeffs(kind, group hyper, step, grad_scale, first) for its group
};

struct DeviceStepConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  DType grad_dtype = DType::kFloat32;   // fp32, fp16 or bf16
  DType state_dtype = DType::kFloat32;  // fp32 or bf16
  bool copy_out = false;
  DType model_dtype = DType::kBFloat16;  // fp32, fp16 or bf16
};

// Ranges per launch: the kernel's parameter block carries them (about 15 KB; CUDA 12.1+ allows 32 KB
// on sm_70+). Longer lists take ceil(size / kMaxRangesPerLaunch) launches.
inline constexpr size_t kMaxRangesPerLaunch = 128;

// Enqueues the step for every range on `stream` (a cudaStream_t; nullptr: the legacy default stream)
// of the current device; returns the number of launches (0 for an empty list). Asynchronous: the
// ranges' memory must stay valid until the stream reaches this point; `ranges` itself may be reused
// on return. Allocates nothing after a thread's first call. Throws InvalidArgument for a bad dtype or
// a null pointer a range needs, and zero::Error if the launch fails.
int multi_tensor_step(const DeviceStepConfig& config, std::span<const DeviceRange> ranges,
                      void* stream);

}  // namespace zero::optim::cuda
