// CUDA multi-tensor optimizer step kernels. See multi_tensor_step.h; the host side (validation,
// batching, errors) is multi_tensor_step.cc.
#include "optim/cuda/chunk_ranges.h"
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "base/dtype.h"
#include "base/float16.h"
#include "optim/cuda/launch.h"
#include "optim/step_coeffs.h"

namespace zero::optim::detail {
namespace {

// The one-lane "vector" of the device: correctly rounded intrinsics, never contracted.
struct CudaOps {
  using V = float;
  __device__ static V set1(float x) { return x; }
  __device__ static V add(V a, V b) { return __fadd_rn(a, b); }
  __device__ static V mul(V a, V b) { return __fmul_rn(a, b); }
  __device__ static V div(V a, V b) { return __fdiv_rn(a, b); }
  __device__ static V sqrt(V a) { return __fsqrt_rn(a); }
  __device__ static V fma(V a, V b, V c) { return __fmaf_rn(a, b, c); }
  // PyTorch's sign: (0 < a) - (a < 0).
  __device__ static V sign(V a) {
    return __fsub_rn(static_cast<float>(0.0f < a), static_cast<float>(a < 0.0f));
  }
};

}  // namespace
}  // namespace zero::optim::detail

#define ZERO_OPTIM_HD __device__
#include "optim/updates.inc"
#undef ZERO_OPTIM_HD

namespace zero::optim::cuda {
namespace {

using optim::detail::Consts;
using optim::detail::CudaOps;
using detail::kChunk;
using detail::kThreads;
using detail::LaunchParams;

struct NoOut {};

__device__ inline float load(const float* p) { return *p; }
// 16-bit values through base/float16.h, the CPU optimizer's own conversions: the same bits.
__device__ inline float load(const Half* p) { return fp16_bits_to_fp32(p->bits); }
__device__ inline float load(const BFloat16* p) { return bf16_bits_to_fp32(p->bits); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(Half* p, float v) { p->bits = fp32_to_fp16_bits(v); }
__device__ inline void store(BFloat16* p, float v) { p->bits = fp32_to_bf16_bits(v); }

template <class U, class G, class S, class Out>
__global__ void __launch_bounds__(kThreads) step_kernel(const __grid_constant__ LaunchParams p) {
  const unsigned long long total = p.chunk_begin[p.num_ranges];
  for (unsigned long long chunk = blockIdx.x; chunk < total; chunk += gridDim.x) {
    const int lo = detail::range_of_chunk(p.chunk_begin, p.num_ranges, chunk);
    const DeviceRange& r = p.ranges[lo];
    const Consts<CudaOps> k(r.coeffs);
    // SGD without momentum has no buffer to read or write.
    const bool live0 = std::is_same_v<U, optim::detail::SgdUpdate> ? (r.coeffs.flags & kFlagMomentum) != 0
                                                            : U::kStates > 0;
    const size_t begin = static_cast<size_t>(chunk - p.chunk_begin[lo]) * kChunk;
    const size_t end = begin + kChunk < r.n ? begin + kChunk : r.n;
    const G* g = static_cast<const G*>(r.grad);
    S* s0 = static_cast<S*>(r.state0);
    S* s1 = static_cast<S*>(r.state1);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
      float vp = r.master[i];
      const float vg = CudaOps::mul(load(g + i), k.grad_scale);
      float v0 = 0.0f, v1 = 0.0f;
      if (live0) v0 = load(s0 + i);
      if constexpr (U::kStates > 1) v1 = load(s1 + i);
      U::template apply<CudaOps>(vp, vg, v0, v1, k);
      r.master[i] = vp;
      if (live0) store(s0 + i, v0);
      if constexpr (U::kStates > 1) store(s1 + i, v1);
      if constexpr (!std::is_same_v<Out, NoOut>) store(static_cast<Out*>(r.model_out) + i, vp);
    }
  }
}

using KernelPtr = void (*)(LaunchParams);

template <class U, class G, class S>
KernelPtr pick_out(int out) {
  switch (out) {
    case 1: return &step_kernel<U, G, S, float>;
    case 2: return &step_kernel<U, G, S, Half>;
    case 3: return &step_kernel<U, G, S, BFloat16>;
    default: return &step_kernel<U, G, S, NoOut>;
  }
}
template <class U, class G>
KernelPtr pick_state(int state, int out) {
  return state == 0 ? pick_out<U, G, float>(out) : pick_out<U, G, BFloat16>(out);
}
template <class U>
KernelPtr pick_grad(int grad, int state, int out) {
  switch (grad) {
    case 1: return pick_state<U, Half>(state, out);
    case 2: return pick_state<U, BFloat16>(state, out);
    default: return pick_state<U, float>(state, out);
  }
}
KernelPtr pick(OptimizerKind kind, int grad, int state, int out) {
  switch (kind) {
    case OptimizerKind::kAdamW: return pick_grad<optim::detail::AdamWUpdate>(grad, state, out);
    case OptimizerKind::kAdam: return pick_grad<optim::detail::AdamUpdate>(grad, state, out);
    case OptimizerKind::kSgd: return pick_grad<optim::detail::SgdUpdate>(grad, state, out);
    case OptimizerKind::kAdagrad: return pick_grad<optim::detail::AdagradUpdate>(grad, state, out);
    case OptimizerKind::kLion: return pick_grad<optim::detail::LionUpdate>(grad, state, out);
    case OptimizerKind::kMuon:  // not elementwise (multi_tensor_step refuses them first)
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kAdafactor: return nullptr;
  }
  return nullptr;
}

}  // namespace

namespace detail {

int launch_step(OptimizerKind kind, int grad, int state, int out, const LaunchParams& params,
                unsigned grid, void* stream) {
  const KernelPtr kernel = pick(kind, grad, state, out);
  if (kernel == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace detail
}  // namespace zero::optim::cuda
