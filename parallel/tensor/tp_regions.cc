#include "parallel/tensor/tp_regions.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "base/fault_injection.h"

namespace zero::parallel {
namespace {

using zero::DType;
using comm::ReduceOp;

// The collectives move rank-major blocks: [tp][outer][seq/tp][inner]. The model's layout is
// [outer][seq][inner]; these reorder between the two (a copy each way, as for any strided split).
void to_rank_major(const float* full, float* blocks, const SequenceShape& s, int tp) {
  const size_t part = s.seq / static_cast<size_t>(tp) * s.inner;
  for (int r = 0; r < tp; ++r) {
    for (size_t o = 0; o < s.outer; ++o) {
      const float* from = full + (o * s.seq * s.inner) + static_cast<size_t>(r) * part;
      std::copy_n(from, part, blocks + (static_cast<size_t>(r) * s.outer + o) * part);
    }
  }
}

void from_rank_major(const float* blocks, float* full, const SequenceShape& s, int tp) {
  const size_t part = s.seq / static_cast<size_t>(tp) * s.inner;
  for (int r = 0; r < tp; ++r) {
    for (size_t o = 0; o < s.outer; ++o) {
      const float* from = blocks + (static_cast<size_t>(r) * s.outer + o) * part;
      std::copy_n(from, part, full + (o * s.seq * s.inner) + static_cast<size_t>(r) * part);
    }
  }
}

void all_gather_rows(comm::Communicator& tp, const float* local, float* full, const SequenceShape& s) {
  const size_t n = s.local_count(tp.size());
  fault::point("tp_collective");
  std::vector<float> blocks(s.full_count());
  tp.all_gather(local, blocks.data(), n, DType::kFloat32)->wait();
  from_rank_major(blocks.data(), full, s, tp.size());
}

void reduce_scatter_rows(comm::Communicator& tp, const float* full, float* local, const SequenceShape& s) {
  const size_t n = s.local_count(tp.size());
  std::vector<float> blocks(s.full_count());
  to_rank_major(full, blocks.data(), s, tp.size());
  fault::point("tp_collective");
  tp.reduce_scatter(blocks.data(), local, n, DType::kFloat32, ReduceOp::kSum)->wait();
}

}  // namespace

size_t SequenceShape::local_count(int tp) const {
  if (tp < 1) ZERO_THROW(InvalidArgument, "sequence parallelism: tp {} is not positive", tp);
  if (seq % static_cast<size_t>(tp) != 0) {
    ZERO_THROW(InvalidArgument,
               "sequence parallelism: the sequence length {} does not divide by tp {} (each rank "
               "holds an equal part of the sequence)",
               seq, tp);
  }
  return outer * (seq / static_cast<size_t>(tp)) * inner;
}

void CopyToTp::backward(comm::Communicator& tp, float* grad, size_t count) {
  fault::point("tp_collective");
  if (tp.size() > 1) tp.all_reduce(grad, count, DType::kFloat32, ReduceOp::kSum)->wait();
}

void ReduceFromTp::forward(comm::Communicator& tp, float* x, size_t count) {
  fault::point("tp_collective");
  if (tp.size() > 1) tp.all_reduce(x, count, DType::kFloat32, ReduceOp::kSum)->wait();
}

void GatherFromSequence::forward(comm::Communicator& tp, const float* local, float* full,
                                 const SequenceShape& shape) {
  all_gather_rows(tp, local, full, shape);
}

void GatherFromSequence::backward(comm::Communicator& tp, const float* full_grad, float* local_grad,
                                  const SequenceShape& shape) {
  reduce_scatter_rows(tp, full_grad, local_grad, shape);
}

void ReduceScatterToSequence::forward(comm::Communicator& tp, const float* full, float* local,
                                      const SequenceShape& shape) {
  reduce_scatter_rows(tp, full, local, shape);
}

void ReduceScatterToSequence::backward(comm::Communicator& tp, const float* local_grad, float* full_grad,
                                       const SequenceShape& shape) {
  all_gather_rows(tp, local_grad, full_grad, shape);
}

}  // namespace zero::parallel
