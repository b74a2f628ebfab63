#pragma once
// optim::Optimizer on a CUDA device: the same optimizers, options, segments, validation and step
// semantics (bit for bit: see multi_tensor_step.h), but the master weights, gradients, optimizer state
// and copy-out live in device memory and each step is enqueued on a stream without host
// synchronization.
//
// The state arrays come from the caller through a StateAllocator, so that the engine allocates (and
// tracks) them through its own device layer; this library owns no device memory.
//
// In a CPU build (no --config=cuda) the class exists and its constructor validates its arguments as
// in a CUDA build, then throws InvalidArgument ("built without CUDA").
//
// Thread safety: one step at a time per CudaOptimizer; accessors may be used between steps.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "optim/optimizer.h"

namespace zero::optim::cuda {

// Returns `bytes` of device memory for the optimizer state array `state_name` (one of
// state_names()), zero-filled by the time it returns, owned by the caller and valid for the
// optimizer's life. May return nullptr only when bytes == 0.
using StateAllocator = std::function<void*(size_t bytes, const std::string& state_name)>;

class CudaOptimizer {
 public:
  // Validates `options` and `segments` as Optimizer's constructor does, with the same messages
  // (num_threads and simd_path are ignored: they choose how the CPU optimizer runs), and that `alloc`
  // is set; all of this before any CUDA call. Then asks `alloc` for each state array (shard_numel
  // elements of state_dtype; a null result for a non-empty array throws AllocationError), fills
  // Adagrad's "sum" with each group's initial_accumulator_value on `stream` (a cudaStream_t;
  // nullptr: the legacy default stream) and waits for that fill. The current device must be the one
  // holding the memory.
  CudaOptimizer(const OptimizerOptions& options, size_t shard_numel, std::vector<Segment> segments,
                StateAllocator alloc, void* stream = nullptr);
  ~CudaOptimizer();
  CudaOptimizer(CudaOptimizer&&) noexcept;
  CudaOptimizer& operator=(CudaOptimizer&&) noexcept;
  CudaOptimizer(const CudaOptimizer&) = delete;
  CudaOptimizer& operator=(const CudaOptimizer&) = delete;

  // Optimizer::step on the device: the pointers of `in` are device pointers (shard_numel elements),
  // the update is enqueued on `stream` of the current device and the call returns without waiting.
  // Padding (elements outside every segment) is never read or written. The memory must stay valid
  // until the stream reaches the step. Throws InvalidArgument for a bad input (step_count() is then
  // unchanged) and zero::Error if the launch fails.
  void step(const StepInput& in, void* stream);

  // Bucket by bucket, as Optimizer::begin_step/step_range: begin_step() validates the groups'
  // hyperparameters and increments step_count(); each step_range() enqueues the update of the segment
  // elements inside [begin, end), whose `in` pointers address element `begin` (device pointers; the
  // length fields, when set, must equal end - begin). One multi_tensor_step call per step_range (one
  // kernel launch per 128 segments in the range); no host synchronization and no allocation.
  void begin_step();
  void step_range(const StepInput& in, size_t begin, size_t end, void* stream);

  int64_t step_count() const;
  // For checkpoint loading. Also tells SGD whether its momentum buffers exist (step_count > 0).
  void set_step_count(int64_t steps);

  OptimizerKind kind() const;
  size_t shard_numel() const;
  const std::vector<Segment>& segments() const;
  Hyper& group(int i);  // e.g. to set lr from a schedule; validated at the next step
  const Hyper& group(int i) const;
  int num_groups() const;

  // AdamW/Adam: "exp_avg", "exp_avg_sq"; SGD: "momentum_buffer"; Adagrad: "sum"; Lion: "exp_avg".
  std::vector<std::string> state_names() const;
  DType state_dtype() const;
  // The device array (shard_numel elements of state_dtype) the allocator returned for `name`;
  // throws InvalidArgument for an unknown name.
  void* state_data(const std::string& name);
  const void* state_data(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::optim::cuda
