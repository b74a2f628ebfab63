#pragma once
// The optimizer over the rank's optimizer space, on whichever device holds it: the CPU optimizer
// (optim::Optimizer) for host memory, the CUDA multi-tensor optimizer for GPU memory. ShardedUpdate
// drives it bucket by bucket and never asks which one it has.
#include <memory>
#include <string>
#include <vector>

#include "memory/device.h"
#include "optim/optimizer.h"

namespace zero {

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  virtual void begin_step() = 0;
  // Updates the segment elements in [begin, end); `in`'s pointers address element `begin` in the
  // device's memory. Runs on `stream`.
  virtual void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) = 0;
  virtual int64_t step_count() const = 0;
  virtual optim::Hyper& group(int i) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  virtual DType state_dtype() const = 0;
  // The CPU optimizer, when that is what runs (state inspection, checkpoints); else nullptr.
  virtual optim::Optimizer* host_optimizer() = 0;
};

// Optimizer state is allocated through `device` (category optimizer_state, in its tracker).
std::unique_ptr<ShardOptimizer> make_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                     size_t numel, std::vector<optim::Segment> segments);

}  // namespace zero
