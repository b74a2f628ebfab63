#pragma once
// MatrixExchange: Muon's matrices on the even-shard layout. Muon orthogonalizes each matrix's update
// whole (optim/newton_schulz.h), but at stages 1-3 a rank's chunk of a bucket holds pieces of rows
// and columns. Once per step, after the caller has written the update input u (fp32) of every
// bucket with matrices, every rank of the shard group:
//
//   all-gathers each bucket's chunks of u, keeping the matrices it was handed  -> its matrices, whole
//   orthogonalizes them                                                        -> in that buffer
//   reduce-scatters each bucket (its own matrices, zeros elsewhere; a sum)    -> each chunk's update
//
// Each matrix is handed to one rank for the whole step (the largest first, each to the least loaded
// rank, by Newton-Schulz FLOPs), so the busiest rank runs at most the largest matrix's FLOPs beyond
// an even share: the step waits for it once, not for each bucket's slowest rank (a bucket holds a
// few matrices, fewer than a large group's ranks). The sum adds one value and zeros per element,
// which is exact, so the result has the owner's bits at every world size. The layout keeps every
// matrix inside one bucket (ShardLayoutOptions::whole_tensor_buckets).
// Replicated ownership (stage 0) or one rank: nothing is exchanged; the owned range is the whole
// bucket, and every rank orthogonalizes every matrix itself (the same bits), bucket by bucket.
//
// A matrix that is one rank's part of a matrix split across another group (tensor parallelism's
// split placements; ExchangedMatrix::whole) is orthogonalized whole: its owner gathers the parts
// over that group (every rank of it owns the same matrices, the layouts being equal, and visits them
// in the same order), runs Newton-Schulz on the whole matrix and keeps its part. Each rank of the
// group computes the same whole matrix from the same bits, so the parts stay one matrix.
//
// The traffic is two bucket-sized collectives per bucket with matrices, fp32 (more than Moonlight's
// one gather per matrix, which computes every matrix on every rank instead). The memory, where it
// exchanges: u over the rank's owned ranges of those buckets, the matrices it was handed (the
// largest rank's share, on every rank), and two bucket-sized buffers; host memory only (the shard
// group must take host buffers: Gloo).
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
  size_t buckets_with_matrices() const { return matrix_buckets_.size(); }
  // Whether a shard group exchanges the matrices (orthogonalize_step); else each bucket is
  // orthogonalized by itself (orthogonalize_bucket).
  bool exchanges() const { return shard_ != nullptr; }
  // Where the caller writes the update input of a bucket with matrices: fp32, as long as the
  // bucket's owned range; on return from the orthogonalization, at the matrices' elements, the
  // orthogonalized update (other elements: unspecified). Where it exchanges, each bucket has its own
  // (they are all read at once); else one buffer serves every bucket.
  float* input(size_t bucket);
  // Exchanging: every bucket's matrices, from the inputs written this step. Collective over the
  // shard group: every rank calls it once per step, after writing every bucket's input.
  void orthogonalize_step();
  // Not exchanging: bucket `bucket`'s matrices in its input, here.
  void orthogonalize_bucket(size_t bucket);
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
    size_t mine_offset = 0;  // where it lies in the owner's buffer of its matrices
  };
  // Orthogonalizes p's matrix at `x` in place.
  static void orthogonalize_one(const Placed& p, float* x);
  const ShardLayout& layout_;
  comm::Communicator* shard_;  // null: nothing to exchange
  std::chrono::milliseconds timeout_;
  std::map<size_t, size_t> bucket_at_;         // owned range start -> bucket
  std::vector<std::vector<Placed>> by_bucket_;  // per bucket
  std::vector<size_t> matrix_buckets_;          // the buckets with matrices, in order
  std::vector<size_t> input_at_;                // per bucket: its input's offset in input_ (exchanging)
  std::vector<int> owner_;                      // per layout tensor
  std::vector<double> flops_;
  memory::Buffer input_;           // exchanging: every such bucket's owned range; else the largest one
  memory::Buffer mine_;            // exchanging: the matrices this rank was handed, whole
  memory::Buffer gathered_, out_;  // exchanging: a bucket of fp32 each
};

}  // namespace zero
