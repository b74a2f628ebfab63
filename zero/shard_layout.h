#pragma once
// ShardLayout: where every trainable tensor lives in the flat gradient/parameter space, how that space
// is cut into buckets, and which part of each bucket every rank owns.
//
// A pure function of (tensor sizes, world size, options): every rank computes the same layout.
//
//  flat space   |t0....|pad|t1..........|t2.|pad|t3.......................|   (tensor starts aligned)
//  buckets      |<------ bucket 0 ------>|<------ bucket 1 ------>|<- 2 ->|pad|
//  rank chunks  | r0  | r1  | r2  | r3  | r0  | r1  | r2  | r3  | ...
//
// Tensors are packed in the order given; a tensor may span buckets. Every bucket's padded length is
// a multiple of world_size * block, so it splits into world_size equal chunks and rank r's chunk starts
// at r * chunk: reduce-scatter output and all-gather input are in place (NCCL's rule).
//
// Units. Given each tensor's unit (tensors of a unit consecutive), every unit starts on a block. With
// `unit_buckets` (stage 3: each unit is one flat parameter, FSDP's FlatParameter) every unit is one
// bucket of its own, padded to world_size * block, so the next unit starts after that padding;
// otherwise buckets are cut every `bucket_numel` elements and only the last is padded. Either way the
// data's partition into blocks of `block` elements is the same at every stage and world size, and
// padding only adds whole zero blocks: norms summed per block in global order come out bitwise the
// same everywhere.
//
// Whole tensors per bucket (`whole_tensor_buckets`): every tensor starts on a block, with or without
// unit_buckets, so that padding a bucket where it is cut moves tensors by whole blocks and the norm's
// blocks are the same at every stage. Without unit_buckets, buckets are cut every bucket_numel
// (rounded to world_size * block) as usual, except that a tensor marked whole (`whole_in_bucket`:
// Muon's matrices) that would cross the cut starts a bucket of its own instead, the bucket before it
// ending early, padded. Unmarked tensors (an embedding) are cut as usual, so no bucket grows to hold
// them. Chunks cut every tensor as usual.
//
// Whole tensors (`whole_tensors`: rules that need a tensor at once, LAMB's trust ratio). No tensor is
// cut: every tensor starts on a block, a bucket holds whole tensors (a unit with unit_buckets; else
// consecutive tensors until they reach bucket_numel and world_size times the largest of them),
// and a bucket's tensors are split into world_size consecutive runs, one per rank chunk, with the
// largest run (in blocks) as small as it can be. The chunk is that largest run, so the other ranks'
// chunks end in padding:
//
//  bucket       |t0......|t1.|pad|t2..........|t3|pad..|t4.......|pad.....|
//  rank chunks  |<------ r0 ---->|<------ r1 ------->|<------ r2 ------>|
//
// The collectives keep their equal chunks; the price is that padding, reported by describe(): a
// chunk is never shorter than the bucket's largest tensor, so a bucket is at least world_size times
// its largest tensor, and a model with one dominant tensor (an embedding) pays for it where
// world_size x that tensor exceeds the model (docs/optim.md has the figures). Blocks never mix
// tensors, so the norm's per-block sums do not depend on the world size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace zero {

struct ShardLayoutOptions {
  size_t alignment = 16;          // tensor start alignment in elements (16 fp32 = 64 bytes)
  size_t bucket_numel = 1 << 24;  // target bucket length in elements (rounded up to world * block)
  size_t block = 1024;            // norm/partition granule in elements; a multiple of alignment
  bool unit_buckets = false;      // one bucket per unit (needs tensor units)
  bool whole_tensors = false;     // every tensor inside one rank's chunk (see the top comment)
  // Every tensor inside one bucket (rank chunks still cut it): a bucket takes whole tensors until it
  // holds bucket_numel elements. For rules that gather a tensor per bucket (Muon, zero/matrix_exchange.h).
  bool whole_tensor_buckets = false;
};

class ShardLayout {
 public:
  struct Tensor {
    size_t numel = 0;
    size_t offset = 0;  // flat offset
    DType dtype = DType::kFloat32;
  };
  struct Bucket {
    size_t offset = 0;  // flat offset of the bucket
    size_t numel = 0;   // elements holding data or inter-tensor alignment (unpadded)
    size_t padded = 0;  // numel rounded up to a multiple of world * block
    size_t chunk = 0;   // padded / world
    size_t shard_offset = 0;  // where this bucket's chunk starts in each rank's shard
    size_t first_tensor = 0;  // tensors [first_tensor, end_tensor) overlap this bucket
    size_t end_tensor = 0;
    int unit = -1;            // with unit_buckets: the unit this bucket holds
    DType dtype = DType::kFloat32;  // every tensor's in the bucket
    size_t bytes = 0;         // where the bucket starts in a flat buffer of the tensors' own dtypes
    size_t shard_bytes = 0;   // where its chunk starts in such a shard
  };
  // A piece of a tensor inside one rank's shard.
  struct Piece {
    size_t tensor = 0;
    size_t tensor_begin = 0;  // element range inside the tensor
    size_t tensor_end = 0;
    size_t shard_offset = 0;  // where it starts in the rank's shard
    size_t bucket = 0;
  };

  ShardLayout() = default;
  // Throws InvalidArgument naming the field for a world size < 1, zero alignment/bucket/block, a
  // block that is not a multiple of the alignment, or a zero-sized tensor.
  // `tensor_units`, when given, holds each tensor's unit; a unit's tensors must be consecutive.
  // `starts_block`, when given, marks tensors that start on a block even inside a unit (tensor
  // parallelism: no block mixes tensors counted once in the norm with tensors every rank counts).
  // `tensor_dtypes`, when given, holds each tensor's dtype (the one its gradients and gathered values
  // take); otherwise every tensor is fp32. `whole_in_bucket`, with whole_tensor_buckets, marks the
  // tensors no bucket may cut (empty: every tensor).
  ShardLayout(const std::vector<size_t>& tensor_numels, int world_size,
              const ShardLayoutOptions& options = {}, const std::vector<int>& tensor_units = {},
              const std::vector<bool>& starts_block = {}, const std::vector<DType>& tensor_dtypes = {},
              const std::vector<bool>& whole_in_bucket = {});

  int world_size() const { return world_size_; }
  const ShardLayoutOptions& options() const { return options_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t total_numel() const { return total_numel_; }    // unpadded flat length
  size_t padded_numel() const { return padded_numel_; }  // sum of padded bucket lengths
  size_t shard_numel() const { return padded_numel_ / world_size_; }  // every rank's shard length
  size_t max_bucket_padded() const;
  // Bytes, each bucket in its dtype: the padded flat space, a shard, bucket b padded, the largest.
  size_t padded_bytes() const { return padded_bytes_; }
  size_t shard_bytes() const { return shard_bytes_; }
  size_t bucket_bytes(size_t b) const { return buckets_[b].padded * dtype_size(buckets_[b].dtype); }
  size_t max_bucket_bytes() const;
  // Byte offsets of flat element `flat` (in bucket b) in a flat buffer, and of shard element
  // `shard` (in bucket b's chunk) in a shard, each bucket in its dtype.
  size_t flat_bytes(size_t b, size_t flat) const;
  size_t shard_bytes(size_t b, size_t shard) const;
  bool mixed_dtypes() const { return mixed_dtypes_; }

  // Flat range [begin, end) of rank r inside bucket b.
  size_t chunk_begin(size_t bucket, int rank) const;
  // Pieces of tensors owned by rank r, in shard order.
  std::vector<Piece> pieces(int rank) const;
  // Bucket holding flat offset `flat` (throws when out of range).
  size_t bucket_of(size_t flat) const;
  // Buckets that tensor t overlaps: [first, last].
  std::pair<size_t, size_t> buckets_of_tensor(size_t t) const;
  size_t num_blocks() const { return padded_numel_ / options_.block; }

  // One line per bucket, for logs and error messages.
  std::string describe() const;

 private:
  // The whole_tensors layout of the tensors (see the top comment).
  void lay_out_tensor_buckets(const std::vector<size_t>& tensor_numels, const std::vector<DType>& tensor_dtypes,
                              const std::vector<bool>& whole_in_bucket);
  void lay_out_whole_tensors(const std::vector<size_t>& tensor_numels, const std::vector<int>& tensor_units,
                             const std::vector<DType>& tensor_dtypes);
  // Each tensor's and bucket's dtype, and the buckets' byte offsets.
  void set_dtypes(const std::vector<DType>& tensor_dtypes);
  int world_size_ = 1;
  ShardLayoutOptions options_;
  std::vector<Tensor> tensors_;
  std::vector<Bucket> buckets_;
  size_t total_numel_ = 0;
  size_t padded_numel_ = 0;
  size_t padded_bytes_ = 0;
  size_t shard_bytes_ = 0;
  bool mixed_dtypes_ = false;
};

}  // namespace zero
