#include "comm/gloo/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/check.h"

namespace zero::comm {
namespace {

// Elements per block: the accumulator and one widened source stay in L1.
constexpr size_t kBlock = 1024;

// Storage type -> accumulator type, with widening load and narrowing store.
template <typename T>
struct Accum {
  using type = T;
  static void load(const void* src, type* dst, size_t n) { std::memcpy(dst, src, n * sizeof(T)); }
  static void store(const type* src, void* dst, size_t n) { std::memcpy(dst, src, n * sizeof(T)); }
};
template <>
struct Accum<Half> {
  using type = float;
  static void load(const void* src, float* dst, size_t n) {
    convert_fp16_to_fp32(static_cast<const uint16_t*>(src), dst, n);
  }
  static void store(const float* src, void* dst, size_t n) {
    convert_fp32_to_fp16(src, static_cast<uint16_t*>(dst), n);
  }
};
template <>
struct Accum<BFloat16> {
  using type = float;
  static void load(const void* src, float* dst, size_t n) {
    convert_bf16_to_fp32(static_cast<const uint16_t*>(src), dst, n);
  }
  static void store(const float* src, void* dst, size_t n) {
    convert_fp32_to_bf16(src, static_cast<uint16_t*>(dst), n);
  }
};

template <typename A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <ReduceOp Op, typename A>
A combine(A a, A b) {
  if constexpr (Op == ReduceOp::kMax) {
    return b > a ? b : a;
  } else if constexpr (Op == ReduceOp::kMin) {
    return b < a ? b : a;
  } else {
    return add(a, b);
  }
}

// The loop bound is a compile-time constant for full blocks so that -O2 vectorizes it.
template <ReduceOp Op, typename A>
void combine_block(A* __restrict acc, const A* __restrict x, size_t m) {
  if (m == kBlock) {
    for (size_t i = 0; i < kBlock; ++i) acc[i] = combine<Op>(acc[i], x[i]);
  } else {
    for (size_t i = 0; i < m; ++i) acc[i] = combine<Op>(acc[i], x[i]);
  }
}

template <typename T, ReduceOp Op>
void reduce_typed(const void* const* srcs, size_t nsrc, void* dst, size_t n) {
  using A = typename Accum<T>::type;
  alignas(64) A acc[kBlock];
  alignas(64) A x[kBlock];
  const A divisor = static_cast<A>(nsrc);
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t m = std::min(kBlock, n - start);
    Accum<T>::load(static_cast<const T*>(srcs[0]) + start, acc, m);
    for (size_t k = 1; k < nsrc; ++k) {
      Accum<T>::load(static_cast<const T*>(srcs[k]) + start, x, m);
      combine_block<Op>(acc, x, m);
    }
    if constexpr (Op == ReduceOp::kAvg) {
      for (size_t i = 0; i < m; ++i) acc[i] = acc[i] / divisor;
    }
    Accum<T>::store(acc, static_cast<T*>(dst) + start, m);
  }
}

template <typename T>
void reduce_dispatch_op(ReduceOp op, const void* const* srcs, size_t nsrc, void* dst, size_t n) {
  switch (op) {
    case ReduceOp::kSum: return reduce_typed<T, ReduceOp::kSum>(srcs, nsrc, dst, n);
    case ReduceOp::kAvg: return reduce_typed<T, ReduceOp::kAvg>(srcs, nsrc, dst, n);
    case ReduceOp::kMax: return reduce_typed<T, ReduceOp::kMax>(srcs, nsrc, dst, n);
    case ReduceOp::kMin: return reduce_typed<T, ReduceOp::kMin>(srcs, nsrc, dst, n);
  }
  ZERO_THROW(InvalidArgument, "unknown reduce op value {}", static_cast<int>(op));
}

}  // namespace

void reduce_arrays(DType dtype, ReduceOp op, const void* const* srcs, size_t nsrc, void* dst,
                   size_t n) {
  ZERO_CHECK_GT(nsrc, size_t{0}, "reduce_arrays needs at least one source");
  if (n == 0) return;
  switch (dtype) {
    case DType::kFloat32: return reduce_dispatch_op<float>(op, srcs, nsrc, dst, n);
    case DType::kFloat16: return reduce_dispatch_op<Half>(op, srcs, nsrc, dst, n);
    case DType::kBFloat16: return reduce_dispatch_op<BFloat16>(op, srcs, nsrc, dst, n);
    case DType::kFloat64: return reduce_dispatch_op<double>(op, srcs, nsrc, dst, n);
    case DType::kInt32: return reduce_dispatch_op<int32_t>(op, srcs, nsrc, dst, n);
    case DType::kInt64: return reduce_dispatch_op<int64_t>(op, srcs, nsrc, dst, n);
    case DType::kUInt8: return reduce_dispatch_op<uint8_t>(op, srcs, nsrc, dst, n);
  }
  ZERO_THROW(InvalidArgument, "unknown dtype value {}", static_cast<int>(dtype));
}

}  // namespace zero::comm
