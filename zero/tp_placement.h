#pragma once
// How a parameter lies on the tensor-parallel group (ParamSpec::tp), and the helpers that cut a full
// tensor into a rank's part and put the parts back together. Here rather than in parallel/tensor:
// the engine counts replicated parameters once in the global norm and sums partial gradients.
//
//   replicated          every rank holds the whole tensor (LayerNorm, a row-parallel bias); with
//                       partial_grad (sequence parallelism: each rank saw part of the sequence)
//                       its gradient is the sum over tp of the ranks' gradients
//   split(dim)          rank r holds the r-th of tp equal slices along dim: a column-parallel
//                       weight [out, in] is split(0) (its bias too), a row-parallel one split(1)
//   split(dim, blocks)  dim holds `blocks` equal blocks laid end to end, each split into tp slices;
//                       rank r holds its slice of every block, in block order. GPT-2's fused
//                       c_attn weight [3C, C] is q|k|v along dim 0: split(0, 3) gives a rank its
//                       heads' rows of q, of k and of v (and its bias the same entries)
//
//   dim 0 of [3C, C] with tp = 2, split(0, 3):   | q0 q1 | k0 k1 | v0 v1 |
//   rank 0 holds q0 k0 v0 ([3C/2, C]), rank 1 holds q1 k1 v1.
#include <cstdint>
#include <string>
#include <vector>

namespace zero {

struct TpPlacement {
  enum class Kind { kReplicated, kSplit };
  Kind kind = Kind::kReplicated;
  int dim = 0;     // kSplit: the dimension cut
  int blocks = 1;  // kSplit: equal blocks along dim, each cut into tp slices
  bool partial_grad = false;  // kReplicated: the engine sums the gradient over tp

  static TpPlacement replicated() { return {}; }
  // Replicated, with each rank's gradient a partial sum (sequence parallelism).
  static TpPlacement replicated_partial() { return {Kind::kReplicated, 0, 1, true}; }
  static TpPlacement split(int dim, int blocks = 1) { return {Kind::kSplit, dim, blocks, false}; }
  bool is_split() const { return kind == Kind::kSplit; }
  bool operator==(const TpPlacement&) const = default;
};

// "replicated", "replicated (partial gradients)", "split(0)", "split(0, 3 blocks)".
std::string describe(const TpPlacement& placement);

// The shape of one rank's part of a tensor of `shape`. Throws InvalidArgument naming `name`, the
// dimension, its size, the blocks and tp when the split does not divide evenly, or when dim is out
// of range or blocks is not positive.
std::vector<int64_t> local_shape(const std::string& name, const std::vector<int64_t>& shape,
                                 const TpPlacement& placement, int tp);

// The placement of a parameter whose part has `local` shape is possible: dim in range, blocks
// positive, the local dimension a multiple of blocks. Throws InvalidArgument naming `name`.
void check_local(const std::string& name, const std::vector<int64_t>& local, const TpPlacement& placement);

// The whole tensor's shape from one rank's part (the split dimension times tp).
std::vector<int64_t> full_shape(const std::vector<int64_t>& local, const TpPlacement& placement, int tp);

// Copies rank `tp_rank`'s part of `full` (of `shape`) into `local` (local_shape's size). A
// replicated tensor's part is the whole tensor.
void shard(const float* full, const std::vector<int64_t>& shape, const TpPlacement& placement, int tp_rank,
           int tp, float* local);

// The converse: writes rank `tp_rank`'s part into its place in `full`. Calling it for every rank
// assembles the full tensor.
void unshard(const float* local, const std::vector<int64_t>& shape, const TpPlacement& placement,
             int tp_rank, int tp, float* full);

// A contiguous run of elements: `n` of them at `local` in one rank's part (rank `part`) and at
// `full` in the whole tensor (row-major offsets). A checkpoint saved at one tp reads its pieces back
// at another through these: a rank's wanted range becomes runs of the whole tensor, and those runs
// become ranges of the saved parts.
struct TpRun {
  int part = 0;
  size_t local = 0, full = 0, n = 0;
};

// Rank `tp_rank`'s part elements [begin, end) as runs of the whole tensor of `shape`, in local order
// (one run for a replicated tensor or tp 1). The placement must suit the shape (local_shape).
std::vector<TpRun> part_runs(const std::vector<int64_t>& shape, const TpPlacement& placement, int tp_rank, int tp,
                             size_t begin, size_t end);

// The whole tensor's elements [begin, end) as runs of the tp parts that hold them, in whole order. A
// replicated tensor is one part (part 0) that is the whole.
std::vector<TpRun> whole_runs(const std::vector<int64_t>& shape, const TpPlacement& placement, int tp, size_t begin,
                              size_t end);

}  // namespace zero
