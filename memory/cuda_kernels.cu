// The CUDA device's elementwise kernels (see cuda_kernels.h): bitwise the results of
// memory/host_kernels.cc.
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "base/float16.h"  // the host's conversions, compiled for the device too
#include "memory/cuda_kernels.h"

namespace zero::memory::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1u << 16;  // grid-stride beyond this

// Element access by dtype: load widens to fp32, store rounds once.
struct F32 {
  using T = float;
  __device__ static float load(const T* p, size_t i) { return p[i]; }
  __device__ static void store(T* p, size_t i, float v) { p[i] = v; }
};
struct F16 {
  using T = uint16_t;
  __device__ static float load(const T* p, size_t i) { return fp16_bits_to_fp32(p[i]); }
  __device__ static void store(T* p, size_t i, float v) { p[i] = fp32_to_fp16_bits(v); }
};
struct BF16 {
  using T = uint16_t;
  __device__ static float load(const T* p, size_t i) { return bf16_bits_to_fp32(p[i]); }
  __device__ static void store(T* p, size_t i, float v) { p[i] = fp32_to_bf16_bits(v); }
};

// Calls f(Elem{}) for the element type of `dtype`.
template <typename F>
int with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(F32{});
    case DType::kFloat16: return f(F16{});
    case DType::kBFloat16: return f(BF16{});
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return blocks < kMaxBlocks ? static_cast<unsigned>(blocks) : kMaxBlocks;
}

int launched() { return static_cast<int>(cudaGetLastError()); }

#define ZERO_GRID_STRIDE(i, n)                                                    \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(blockDim.x) * gridDim.x)

template <class S, class D>
__global__ void convert_kernel(const typename S::T* src, typename D::T* dst, size_t n) {
  ZERO_GRID_STRIDE(i, n) { D::store(dst, i, S::load(src, i)); }
}

template <class S, class D>
__global__ void convert_rows_kernel(const typename S::T* src, size_t src_stride, typename D::T* dst,
                                    size_t dst_stride, size_t n, size_t total) {
  ZERO_GRID_STRIDE(i, total) {
    const size_t r = i / n, j = i % n;
    D::store(dst, r * dst_stride + j, S::load(src, r * src_stride + j));
  }
}

template <class D, class S>
__global__ void accumulate_kernel(typename D::T* dst, const typename S::T* src, size_t n) {
  ZERO_GRID_STRIDE(i, n) { D::store(dst, i, __fadd_rn(D::load(dst, i), S::load(src, i))); }
}

template <class E>
__global__ void scale_kernel(typename E::T* x, size_t n, float factor) {
  ZERO_GRID_STRIDE(i, n) { E::store(x, i, __fmul_rn(E::load(x, i), factor)); }
}

template <class I, class O>
__global__ void ordered_sum_kernel(const typename I::T* ins, size_t stride, int k,
                                   typename O::T* out, size_t n) {
  ZERO_GRID_STRIDE(i, n) {
    float acc = I::load(ins, i);
    for (int q = 1; q < k; ++q) acc = __fadd_rn(acc, I::load(ins, static_cast<size_t>(q) * stride + i));
    O::store(out, i, acc);
  }
}

// Sums of squares: 16 threads per data block, thread `lane` summing elements lane, lane + 16, ...
// in order (the host's lane lane), then the host's tree over the 16 lane sums in shared memory.
constexpr int kLanes = 16;
constexpr int kBlocksPerCta = 8;
constexpr int kSumThreads = kLanes * kBlocksPerCta;

template <class E>
__global__ void __launch_bounds__(kSumThreads)
    block_sum_of_squares_kernel(const typename E::T* x, size_t block, size_t blocks, double* out) {
  __shared__ double lanes[kSumThreads];
  const int lane = threadIdx.x % kLanes;
  const int group = threadIdx.x / kLanes;
  const size_t j = static_cast<size_t>(blockIdx.x) * kBlocksPerCta + group;
  double acc = 0.0;
  if (j < blocks) {
    const typename E::T* base = x + j * block;
    for (size_t i = lane; i < block; i += kLanes) {
      const double v = E::load(base, i);
      acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
  }
  lanes[threadIdx.x] = acc;
  __syncthreads();
  double* mine = lanes + group * kLanes;
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    if (lane < w) mine[lane] = __dadd_rn(mine[lane], mine[lane + w]);
    __syncthreads();
  }
  if (lane == 0 && j < blocks) out[j] = mine[0];
}

}  // namespace

int convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(src_dtype, [&](auto se) {
    return with_dtype(dst_dtype, [&](auto de) {
      using S = decltype(se);
      using D = decltype(de);
      convert_kernel<S, D><<<grid_for(n), kThreads, 0, s>>>(
          static_cast<const typename S::T*>(src), static_cast<typename D::T*>(dst), n);
      return launched();
    });
  });
}

int convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                 size_t rows, size_t n, void* stream) {
  const size_t total = rows * n;
  if (total == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(src_dtype, [&](auto se) {
    return with_dtype(dst_dtype, [&](auto de) {
      using S = decltype(se);
      using D = decltype(de);
      convert_rows_kernel<S, D><<<grid_for(total), kThreads, 0, s>>>(
          static_cast<const typename S::T*>(src), src_stride, static_cast<typename D::T*>(dst), dst_stride, n,
          total);
      return launched();
    });
  });
}

int accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(dst_dtype, [&](auto de) {
    return with_dtype(src_dtype, [&](auto se) {
      using D = decltype(de);
      using S = decltype(se);
      accumulate_kernel<D, S><<<grid_for(n), kThreads, 0, s>>>(
          static_cast<typename D::T*>(dst), static_cast<const typename S::T*>(src), n);
      return launched();
    });
  });
}

int scale(void* x, DType dtype, size_t n, float factor, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    scale_kernel<E><<<grid_for(n), kThreads, 0, s>>>(static_cast<typename E::T*>(x), n, factor);
    return launched();
  });
}

int ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                size_t n, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(in_dtype, [&](auto ie) {
    return with_dtype(out_dtype, [&](auto oe) {
      using I = decltype(ie);
      using O = decltype(oe);
      ordered_sum_kernel<I, O><<<grid_for(n), kThreads, 0, s>>>(
          static_cast<const typename I::T*>(ins), stride, k, static_cast<typename O::T*>(out), n);
      return launched();
    });
  });
}

int block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out,
                         void* stream) {
  if (blocks == 0) return 0;
  const size_t ctas = (blocks + kBlocksPerCta - 1) / kBlocksPerCta;
  if (ctas > 0x7fffffffu) return static_cast<int>(cudaErrorInvalidConfiguration);
  auto s = static_cast<cudaStream_t>(stream);
  return with_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    block_sum_of_squares_kernel<E><<<static_cast<unsigned>(ctas), kSumThreads, 0, s>>>(
        static_cast<const typename E::T*>(x), block, blocks, out);
    return launched();
  });
}

}  // namespace zero::memory::cuda_kernels
