#pragma once
// MatrixExchange: Muon's matrices on the even-shard layout. Muon orthogonalizes each matrix's update
// whole (optim/newton_schulz.h), but at stages 1-3 a rank's chunk of a bucket holds pieces of rows
// and columns. Per bucket, in the update's bucket order, every rank of the shard group:
//
//   all-gathers its chunk of the update input u (fp32)      -> the bucket, whole, on every rank
//   orthogonalizes the matrices it was handed               -> into a zeroed bucket buffer
//   reduce-scatters that buffer (sum)                       -> each chunk's orthogonalized update
//
// Each matrix is handed to one rank (per bucket, the largest first, each to the rank least loaded in
// that bucket, then over all buckets, by Newton-Schulz FLOPs), so the ranks split the work; the sum adds one value
// and zeros per element, which is exact, so the result has the owner's bits at every world size.
// The layout keeps every matrix inside one bucket (ShardLayoutOptions::whole_tensor_buckets).
// Replicated ownership (stage 0) or one rank: the owned range is the whole bucket, and every rank
// orthogonalizes every matrix itself (the same bits), with no collective.
//
// A matrix that is one rank's part of a matrix split across another group (tensor parallelism's
// split placements; ExchangedMatrix::whole) is orthogonalized whole: its owner gathers the parts
// over that group (every rank of it owns the same matrices, the layouts being equal), runs
// Newton-Schulz on the whole matrix and keeps its part. Each rank of the group computes the same
// whole matrix from the same bits, so the parts stay one matrix.
//
// The traffic is two bucket-sized collectives over the buckets that hold matrices, fp32 (more than
// Moonlight's one gather per matrix, which computes every matrix on every rank instead); host
// memory only (the shard group must take host buffers: Gloo).
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "optim/newton_schulz.h"
#include "optim/optimizer.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"

namespace zero {

struct ExchangedMatrix {
  size_t tensor = 0;  // layout tensor index
  size_t rows = 0, cols = 0;  // the matrix orthogonalized (the whole one where `whole` is set)
  optim::NewtonSchulzOptions ns;
  optim::WholeTensorGather whole;  // set where the tensor is a part of a matrix split across ranks
};

class MatrixExchange {
 public:
  // `shard`: the group the layout's chunks are cut over (null or one rank: no collective). Buffers
  // come from `device` (host memory: the optimizer's), category comm_buffer. Throws InvalidArgument
  // when `shard` does not take host memory or a matrix lies across buckets.
  MatrixExchange(const ShardLayout& layout, const ShardOwnership& ownership, std::vector<ExchangedMatrix> matrices,
                 comm::Communicator* shard, memory::Device& device, std::chrono::milliseconds timeout);

  // The bucket whose owned range starts at optimizer-space element `opt_begin`; SIZE_MAX if none.
  size_t bucket_at(size_t opt_begin) const;
  bool has_matrices(size_t bucket) const;
  // Where the caller writes the update input of a bucket with matrices: fp32, as long as the
  // bucket's owned range (the same buffer for every bucket).
  float* input(size_t bucket);
  // `u`: fp32 over bucket `bucket`'s owned range; at the matrices' elements the update input, on
  // return the orthogonalized update (other elements: unspecified). Collective over the shard group
  // for a bucket with matrices: every rank calls it for such a bucket, in the same order.
  void orthogonalize(size_t bucket, float* u);
  // The rank of the shard group that orthogonalizes layout tensor `tensor` (-1: not a matrix).
  int owner(size_t tensor) const;
  // FLOPs of the Newton-Schulz steps each rank runs per step (the balance, for reports and tests).
  const std::vector<double>& flops_per_rank() const { return flops_; }

 private:
  struct Placed {
    ExchangedMatrix m;
    size_t bucket_offset = 0;  // where it starts in its bucket
    size_t numel = 0;          // its elements here (a part's where m.whole is set)
    int owner = 0;
  };
  // Orthogonalizes p's matrix at `x` in place.
  static void orthogonalize_one(const Placed& p, float* x);
  const ShardLayout& layout_;
  comm::Communicator* shard_;  // null: nothing to exchange
  std::chrono::milliseconds timeout_;
  std::map<size_t, size_t> bucket_at_;         // owned range start -> bucket
  std::vector<std::vector<Placed>> by_bucket_;  // per bucket
  std::vector<int> owner_;                      // per layout tensor
  std::vector<double> flops_;
  memory::Buffer input_;           // the largest owned range of a bucket with matrices, fp32
  memory::Buffer gathered_, out_;  // a bucket of fp32 each, when sharded
};

}  // namespace zero
