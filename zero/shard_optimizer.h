#pragma once
// The optimizer over the rank's optimizer space, on whichever device holds it: the CPU optimizer
// (optim::Optimizer) for host memory, the CUDA multi-tensor optimizer for GPU memory. ShardedUpdate
// drives it bucket by bucket and checkpoints read and write its state, and neither asks which one
// it has.
#include <cstddef>
#include <cstdint>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "memory/device.h"
#include "optim/optimizer.h"
#include "zero/adafactor_stats.h"
#include "zero/checkpoint/state_encoding.h"
#include "zero/matrix_exchange.h"

namespace zero {

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  virtual void begin_step() = 0;
  // Updates the segment elements in [begin, end); `in`'s pointers address element `begin` in the
  // device's memory. Runs on `stream`.
  virtual void step_range(const optim::StepInput& in, size_t begin, size_t end, memory::Stream& stream) = 0;
  // A kind whose update needs several buckets' gradients before any bucket's (Muon where the shard
  // group exchanges its matrices: the exchange balances the whole step's over the ranks) reads them
  // first: for every bucket whose owned range starts at `begin` where prepares(begin) is true, the
  // applier calls prepare_range, in bucket order, after begin_step and before the step's first
  // step_range, with `in` as step_range will get it (its gradient is what it reads; host memory).
  virtual bool prepares(size_t begin) const {
    (void)begin;
    return false;
  }
  virtual void prepare_range(const optim::StepInput& in, size_t begin, size_t end) {
    (void)in;
    (void)begin;
    (void)end;
  }
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t steps) = 0;  // checkpoint load
  virtual optim::Hyper& group(int i) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  virtual DType state_dtype() const = 0;
  // The CPU optimizer, when that is what runs (state inspection); else nullptr.
  virtual optim::Optimizer* host_optimizer() = 0;

  // Checkpoint access to the state, by optimizer-space element: [begin, begin + n) of state `name`,
  // in fp32 whatever state_dtype() is (bf16 state is widened on read and rounded to nearest even on
  // write). Synchronous: the data has moved when the call returns, after the compute stream's work
  // so far. Throws InvalidArgument for an unknown name or a range past the end.
  // An optimizer whose groups run different kinds reads zeros for (and ignores writes to) the
  // elements whose kind keeps no such state.
  virtual void read_state(const std::string& name, size_t begin, size_t n, float* out);
  virtual void write_state(const std::string& name, size_t begin, size_t n, const float* in);
  // The state array itself when it is fp32 in host memory, as long as the optimizer space
  // (checkpoints then read and write it in place); else nullptr.
  virtual float* host_state(const std::string& name);
  // How a checkpoint may store the elements [begin, begin + n) of state `name` (one tensor's) in
  // fewer bytes (zero/checkpoint/state_encoding.h; the save keeps it only where they decode back to
  // their bits, and stores a uniform piece as one value anyway): none by default.
  virtual StateEncoding state_encoding(const std::string& name, size_t begin, size_t n) const;
  // The state's bytes per element (the memory formula's k): where groups run different kinds, the
  // average over the elements of the groups.
  virtual double state_bytes_per_element() const;

 protected:
  ShardOptimizer(memory::Device& device, size_t numel, std::chrono::milliseconds timeout)
      : device_(device), timeout_(timeout), numel_(numel) {}
  // The array (numel elements of state_dtype()) in the device's memory; throws for an unknown name.
  virtual void* state_data(const std::string& name) = 0;
  // InvalidArgument naming `what` and state `name` when [begin, begin + n) runs past the space.
  void check_range(const std::string& name, size_t begin, size_t n, const char* what) const;
  memory::Device& device_;
  std::chrono::milliseconds timeout_;  // the engine's: bounds the state copies' waits

 private:
  void* checked_range(const std::string& name, size_t begin, size_t n, const char* what);
  size_t numel_;
};

// The host rules that are not the SIMD kernels (a custom rule, Muon) read the gradient as fp32:
// elements [at, at + n) of `in`'s range, widened and times in.grad_scale, in `scratch` (grown to
// the largest n once). Host memory.
const float* scaled_fp32_grad(const optim::StepInput& in, size_t at, size_t n, std::vector<float>& scratch);

// Optimizer state is allocated through `device` (category optimizer_state, in its tracker). On a
// meta device (planning) the optimizer only allocates its state. `timeout` bounds every wait (the
// engine's EngineOptions.timeout). Groups of several kinds, or of a kind that is not elementwise
// (Muon, 8-bit AdamW, Adafactor), get one optimizer per elementwise kind over that kind's elements,
// 8-bit AdamW's, and the updates of Muon and Adafactor around `exchanges`, which those kinds need
// (InvalidArgument without them).
struct OptimizerExchanges {
  MatrixExchange* matrices = nullptr;   // Muon's (zero/matrix_exchange.h)
  AdafactorStats* adafactor = nullptr;  // Adafactor's (zero/adafactor_stats.h)
};
std::unique_ptr<ShardOptimizer> make_shard_optimizer(memory::Device& device, optim::OptimizerOptions options,
                                                     size_t numel, std::vector<optim::Segment> segments,
                                                     std::chrono::milliseconds timeout,
                                                     OptimizerExchanges exchanges = {});

}  // namespace zero
