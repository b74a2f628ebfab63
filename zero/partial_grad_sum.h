#pragma once
// PartialGradSum: completes, over a finalizer's group (zero/grad_finalizer.h: its "summed"
// parameters), the reduced gradients of the parameters each rank of it holds whole but whose
// gradient it holds only in part (under tensor parallelism, sequence parallelism's layer norms and
// the row-parallel biases: each rank's backward saw only its own tokens), before the update reads
// them.
//
// The pieces go out packed, one all-reduce per gradient dtype, as Megatron-LM flattens its layer
// norms' gradients into one call: a GPT's layer norms and biases are dozens of pieces of a few
// hundred bytes, and one call per piece pays the group's latency, and the ranks' drift, each time.
// A lone piece of a dtype is summed in place (no copies, no buffer).
//
//   reduced gradients (bucket b's owned range)      pack (one per dtype)       after the all-reduce
//   b0 [ .. |ln1.w| .. ]  b1 [ |ln1.b| .. |ln2.w| ]  [ln1.w|ln1.b|ln2.w]  ->  sums copied back in place
//
// The pack changes no sum: the communicator adds element-wise, each element's values in rank order
// (Gloo) or, with two ranks, one addition either way, so an element's bits do not depend on where
// it sits in the buffer. Every rank of the tp group owns the same pieces in the same order (the tp
// peers share their data-parallel coordinate, hence their ownership), so the packs line up.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"

namespace zero {

class PartialGradSum {
 public:
  struct Piece {
    size_t bucket = 0;
    size_t offset = 0;  // elements into the bucket's reduced gradient
    size_t len = 0;
    DType dtype = DType::kFloat32;  // the reduced gradient's
  };

  // The pack buffers are allocated here (communication buffers), so the memory plan sees them.
  PartialGradSum(memory::Device& device, comm::Communicator& group, const std::vector<Piece>& pieces,
                 std::chrono::milliseconds timeout);

  // Sums the pieces over the tp group in place, bucket b's reduced gradient at bucket_base(b)
  // (GradReducer::reduced); the compute stream's later work sees the sums.
  using BucketBase = std::function<void*(size_t bucket)>;
  void run(const BucketBase& bucket_base);

 private:
  struct Group {  // the pieces of one dtype
    DType dtype = DType::kFloat32;
    std::vector<Piece> pieces;
    size_t numel = 0;
    memory::Buffer pack;  // empty for a lone piece
  };

  memory::Device& device_;
  comm::Communicator& group_;
  CollectiveOrder order_;
  std::vector<Group> groups_;
};

}  // namespace zero
