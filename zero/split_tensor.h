#pragma once
// SplitTensor: how a parameter that is one rank's part of a tensor held across a group (tensor
// parallelism's split placements) relates to the whole tensor, for the optimizers whose update is a
// function of the whole (Muon's orthogonalization, Adafactor's row and column statistics, a custom
// rule's trust ratio). A finalizer that splits parameters describes each (GradFinalizer::split); the
// optimizers use the description and never learn why the tensor is split.
//
//   over         the group across which the parts lie (each rank holds one)
//   whole_shape  the whole tensor's shape (the part's is the registered one)
//   runs         where the part's elements lie in the whole tensor, as contiguous runs: a part cut
//                along dimension 0 is one run, one cut along a later dimension one run per row
//   gather       each array of the part gathered into the whole tensor, updated whole, and the
//                part kept (collective over `over`); empty where this device's memory cannot take
//                part in it (a CUDA device's tensor-parallel group)
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "optim/optimizer.h"

namespace zero {

// `n` elements at `local` in the part and at `whole` in the whole tensor (row-major offsets).
struct SplitRun {
  size_t local = 0, whole = 0, n = 0;
};

struct SplitTensor {
  comm::Communicator* over = nullptr;  // null: the parameter is the whole tensor here
  std::vector<int64_t> whole_shape;
  // The part's elements [begin, end) as runs of the whole tensor, in the part's order.
  std::function<std::vector<SplitRun>(size_t begin, size_t end)> runs;
  optim::WholeTensorGather gather;

  explicit operator bool() const { return over != nullptr; }
};

}  // namespace zero
