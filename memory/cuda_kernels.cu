// The CUDA device's elementwise kernels (see cuda_kernels.h): bitwise the results of
// memory/host_kernels.cc.
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "base/float16.h"  // the host's conversions, compiled for the device too
#include "memory/cuda_kernels.h"
#include "memory/stochastic_draw.h"

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

// Quantization (memory/block_quantization.h), bit for bit the host's: each block's largest finite
// |x| into its scale's slot (a max is exact in any order), then the codes from it, then each slot
// turned into its scale: three launches, so no thread reads a slot another rewrites.
constexpr float kSmallestAbsmax = 0x1p-120f;  // block_quantization_simd.h's block_scale: below it a block is zeros

__device__ bool finite(float v) { return fabsf(v) <= 3.402823466e+38f; }

// The code of v in a block of that absmax: rint(v x inv), or with stochastic rounding (key32
// nonzero; memory/stochastic_draw.h) floor(v x inv + u), each operation rounded once as the host's.
__device__ int code_of(float v, float absmax, float qmax, bool stochastic, uint32_t key32, size_t e) {
  if (!finite(v)) return -static_cast<int>(qmax) - 1;
  const float inv = absmax < kSmallestAbsmax ? 0.0f : __fdiv_rn(qmax, absmax);
  const float y = __fmul_rn(v, inv);
  const float rounded =
      stochastic ? floorf(__fadd_rn(y, stochastic_offset(key32, e))) : rintf(y);
  return static_cast<int>(fminf(fmaxf(rounded, -qmax), qmax));
}

template <class E>
__global__ void __launch_bounds__(kThreads)
    block_absmax_kernel(const typename E::T* x, size_t n, size_t block, size_t blocks, float* slots) {
  __shared__ float part[kThreads];
  for (size_t k = blockIdx.x; k < blocks; k += gridDim.x) {
    const size_t first = k * block;
    const size_t len = block < n - first ? block : n - first;
    float m = 0.0f;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
      const float a = fabsf(E::load(x, first + i));
      m = fmaxf(m, finite(a) ? a : 0.0f);
    }
    part[threadIdx.x] = m;
    __syncthreads();
    for (int w = kThreads / 2; w >= 1; w /= 2) {
      if (threadIdx.x < w) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) slots[k] = part[0];
    __syncthreads();
  }
}

// One byte per thread: an int8 code, or two int4 codes (element 2u low, 2u + 1 high).
template <class E>
__global__ void block_codes_kernel(const typename E::T* x, size_t n, size_t block, int bits, bool stochastic,
                                   uint32_t key32, const float* absmax, uint8_t* codes, unsigned long long* nonfinite) {
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  const size_t bytes = bits == 8 ? n : (n + 1) / 2;
  ZERO_GRID_STRIDE(u, bytes) {
    const int per = bits == 8 ? 1 : 2;
    unsigned byte = 0;
    for (int h = 0; h < per; ++h) {
      const size_t e = u * per + h;
      if (e >= n) break;
      const float v = E::load(x, e);
      const int c = code_of(v, absmax[e / block], qmax, stochastic, key32, e);
      if (!finite(v) && nonfinite != nullptr) atomicAdd(nonfinite, 1ull);
      byte |= bits == 8 ? static_cast<unsigned>(c) & 0xFFu : (static_cast<unsigned>(c) & 0xFu) << (4 * h);
    }
    codes[u] = static_cast<uint8_t>(byte);
  }
}

__global__ void block_scales_kernel(float* slots, size_t blocks, float qmax) {
  ZERO_GRID_STRIDE(k, blocks) { slots[k] = slots[k] < kSmallestAbsmax ? 0.0f : __fdiv_rn(slots[k], qmax); }
}

template <class D>
__global__ void dequantize_rows_kernel(const uint8_t* segments, size_t segment_stride, size_t n, size_t block, int bits,
                                       size_t scales_bytes, typename D::T* dst, size_t dst_stride, size_t total) {
  const int marker = bits == 8 ? -128 : -8;
  ZERO_GRID_STRIDE(i, total) {
    const size_t r = i / n, e = i % n;
    const uint8_t* seg = segments + r * segment_stride;
    const float* scales = reinterpret_cast<const float*>(seg);
    const uint8_t* codes = seg + scales_bytes;
    int c = 0;
    if (bits == 8) {
      c = static_cast<int8_t>(codes[e]);
    } else {
      const int nibble = (codes[e / 2] >> (4 * (e % 2))) & 0xF;
      c = nibble >= 8 ? nibble - 16 : nibble;
    }
    const float v = c == marker ? __int_as_float(0x7fc00000) : __fmul_rn(static_cast<float>(c), scales[e / block]);
    D::store(dst, r * dst_stride + e, v);
  }
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

int quantize_blocks(const void* src, DType src_dtype, size_t n, size_t block, int bits, uint64_t stochastic_key,
                    void* segment, uint64_t* nonfinite, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const size_t blocks = (n + block - 1) / block;
  const size_t scales_bytes = blocks * sizeof(float);
  const size_t code_bytes = bits == 8 ? n : (n + 1) / 2;
  const size_t segment_bytes = (scales_bytes + code_bytes + 3) / 4 * 4;
  auto* slots = static_cast<float*>(segment);
  auto* codes = static_cast<uint8_t*>(segment) + scales_bytes;
  if (segment_bytes > scales_bytes + code_bytes) {
    const cudaError_t pad = cudaMemsetAsync(codes + code_bytes, 0, segment_bytes - scales_bytes - code_bytes, s);
    if (pad != cudaSuccess) return static_cast<int>(pad);
  }
  return with_dtype(src_dtype, [&](auto e) {
    using E = decltype(e);
    const auto* x = static_cast<const typename E::T*>(src);
    const unsigned ctas = blocks < kMaxBlocks ? static_cast<unsigned>(blocks) : kMaxBlocks;
    block_absmax_kernel<E><<<ctas, kThreads, 0, s>>>(x, n, block, blocks, slots);
    if (const int err = launched(); err != 0) return err;
    block_codes_kernel<E><<<grid_for(code_bytes), kThreads, 0, s>>>(
        x, n, block, bits, stochastic_key != 0, stochastic_key32(stochastic_key), slots, codes,
        reinterpret_cast<unsigned long long*>(nonfinite));
    if (const int err = launched(); err != 0) return err;
    block_scales_kernel<<<grid_for(blocks), kThreads, 0, s>>>(slots, blocks, bits == 8 ? 127.0f : 7.0f);
    return launched();
  });
}

int dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, size_t block, int bits,
                    void* dst, DType dst_dtype, size_t dst_stride, void* stream) {
  const size_t total = rows * n;
  if (total == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const size_t scales_bytes = (n + block - 1) / block * sizeof(float);
  return with_dtype(dst_dtype, [&](auto de) {
    using D = decltype(de);
    dequantize_rows_kernel<D><<<grid_for(total), kThreads, 0, s>>>(static_cast<const uint8_t*>(segments),
                                                                    segment_stride, n, block, bits, scales_bytes,
                                                                    static_cast<typename D::T*>(dst), dst_stride,
                                                                    total);
    return launched();
  });
}

}  // namespace zero::memory::cuda_kernels
