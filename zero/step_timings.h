#pragma once
// Where one step's time went, as the engine's parts measured it on the host: how long the loop was
// held up waiting for parameter all-gathers and gradient reductions (the communication that was
// not hidden behind compute), and how long the update took. On CUDA the waits are stream waits and
// cost the host nothing; there the figures are the host's view only.
#include <chrono>
#include <cstdint>

namespace zero {

struct StepTimings {
  double gather_wait_s = 0;    // stage 3: waiting for unit all-gathers (prefetch misses)
  double reduce_wait_s = 0;    // waiting for gradient reductions to complete
  double optimizer_s = 0;      // norm, clip decision, optimizer and parameter writeback
  double writeback_wait_s = 0;  // stages 1, 2: part of optimizer_s waiting for the new parameters' all-gathers
  // Optimizer offload, parts of optimizer_s: the copies of gradient shards to the host and of new
  // parameters back (time the copy streams spent copying), the CPU optimizer's time, and how long
  // the host waited for copies (what of the copies the pipeline did not hide).
  double offload_d2h_s = 0;
  double offload_cpu_s = 0;
  double offload_h2d_s = 0;
  double offload_wait_s = 0;
  uint64_t gathered_bytes = 0;  // parameter bytes all-gathered (whole units or buckets, every rank's part)
  uint64_t prefetched_bytes = 0;  // stage 3: the part of gathered_bytes issued ahead of use
  uint64_t reduced_bytes = 0;   // gradient bytes reduced (whole buckets)
  double exposed_comm_s() const { return gather_wait_s + reduce_wait_s; }
};

// Adds the time until it is destroyed to `*slot` (nullptr: to nothing, for parts whose timings
// are optional).
class ScopedTimer {
 public:
  explicit ScopedTimer(double* slot) : slot_(slot), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    if (slot_ != nullptr) *slot_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* slot_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace zero
