// Host side of the CUDA multi-tensor step: validation, batching into launches, errors. Built only
// under --config=cuda.
#include "optim/cuda/multi_tensor_step.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "base/check.h"
#include "optim/cuda/launch.h"

namespace zero::optim::cuda {

namespace {

int float_index(DType t) {
  return t == DType::kFloat32 ? 0 : t == DType::kFloat16 ? 1 : t == DType::kBFloat16 ? 2 : -1;
}

void check_cuda(int code, const char* what) {
  const auto e = static_cast<cudaError_t>(code);
  if (e != cudaSuccess) {
    ZERO_THROW(Error, "multi_tensor_step: {} failed: {} ({})", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  }
}

}  // namespace

int multi_tensor_step(const DeviceStepConfig& config, std::span<const DeviceRange> ranges,
                      void* stream) {
  const int kind = static_cast<int>(config.kind);
  if (kind < 0 || kind >= kNumElementwiseKinds) {
    ZERO_THROW(InvalidArgument, "DeviceStepConfig.kind: unknown optimizer kind {}", kind);
  }
  const int grad = float_index(config.grad_dtype);
  if (grad < 0) {
    ZERO_THROW(InvalidArgument, "DeviceStepConfig.grad_dtype must be fp32, fp16 or bf16 (got {})",
               dtype_name(config.grad_dtype));
  }
  if (config.state_dtype != DType::kFloat32 && config.state_dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "DeviceStepConfig.state_dtype must be fp32 or bf16 (got {})",
               dtype_name(config.state_dtype));
  }
  const int model = float_index(config.model_dtype);
  if (config.copy_out && model < 0) {
    ZERO_THROW(InvalidArgument, "DeviceStepConfig.model_dtype must be fp32, fp16 or bf16 (got {})",
               dtype_name(config.model_dtype));
  }
  const int out = config.copy_out ? model + 1 : 0;
  const int state = config.state_dtype == DType::kFloat32 ? 0 : 1;
  const bool two_states = config.kind == OptimizerKind::kAdamW || config.kind == OptimizerKind::kAdam;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const DeviceRange& r = ranges[i];
    if (r.n == 0) continue;
    const bool needs_state0 =
        config.kind != OptimizerKind::kSgd || (r.coeffs.flags & kFlagMomentum) != 0;
    if (r.master == nullptr || r.grad == nullptr || (needs_state0 && r.state0 == nullptr) ||
        (two_states && r.state1 == nullptr) || (config.copy_out && r.model_out == nullptr)) {
      ZERO_THROW(InvalidArgument,
                 "ranges[{}]: a pointer the step needs is null (master {}, grad {}, state0 {}, "
                 "state1 {}, model_out {})",
                 i, static_cast<const void*>(r.master), r.grad, r.state0, r.state1, r.model_out);
    }
  }

  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");

  // ~15 KB: kept off the stack of callers with small stacks, and reused so that steps after a
  // thread's first allocate nothing. A launch copies its parameters, so the block is free again as
  // soon as launch_step returns (one per thread: concurrent callers never share it).
  thread_local std::unique_ptr<detail::LaunchParams> scratch;
  if (!scratch) scratch = std::make_unique<detail::LaunchParams>();
  detail::LaunchParams* params = scratch.get();
  int launches = 0;
  size_t next = 0;
  while (next < ranges.size()) {
    params->num_ranges = 0;
    unsigned long long chunks = 0;
    for (; next < ranges.size() && params->num_ranges < static_cast<int>(kMaxRangesPerLaunch);
         ++next) {
      if (ranges[next].n == 0) continue;
      params->chunk_begin[params->num_ranges] = chunks;
      params->ranges[params->num_ranges++] = ranges[next];
      chunks += (ranges[next].n + detail::kChunk - 1) / detail::kChunk;
    }
    params->chunk_begin[params->num_ranges] = chunks;
    if (params->num_ranges == 0) break;
    // Enough blocks to fill the device several times over; each loops over chunks.
    const unsigned long long grid =
        std::min<unsigned long long>(chunks, static_cast<unsigned long long>(std::max(1, sms)) * 8);
    check_cuda(detail::launch_step(config.kind, grad, state, out, *params,
                                   static_cast<unsigned>(grid), stream),
               "kernel launch");
    ++launches;
  }
  return launches;
}

}  // namespace zero::optim::cuda
