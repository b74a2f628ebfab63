#pragma once
// OffloadPipeline (ZeRO-Offload): the fp32 master weights and the optimizer state of the rank's
// owned ranges live in host memory (a host tier with its own memory tracker) and the CPU optimizer
// (optim::Optimizer, SIMD and threaded) updates them. The device keeps only the model-dtype
// parameters and gradients.
//
// One step, bucket by bucket, with two staging slots for gradients and two for new parameters:
//
//   copy stream "d2h"   grad b+1 -> in[(b+1)%2]       (issued before bucket b is updated)
//   host (caller)       wait d2h(b); wait h2d(b-2); CPU optimizer: in[b%2] -> master, state,
//                       out[b%2] (model dtype)
//   copy stream "h2d"   out[b%2] -> the writeback's owned range of bucket b; the compute stream
//                       waits for it and publishes b (the all-gather of stage 1/2 starts there)
//
// so the copy of the next gradient shard, the update of this one and the copy back (and the
// all-gather) of the previous one run at once. The gradient scale (unscale x clip) needs the global
// norm, which needs every bucket reduced, so the pipeline starts after backward: gradients are not
// kept on the host between steps (host bytes: master + state, 12Ψ/N for Adam, plus the staging).
//
// On a CPU-only build the device is host memory and the same pipeline runs; with the host device's
// threaded streams the copies run on their own threads, so a missing event wait is a race that
// ThreadSanitizer reports.
#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "memory/device.h"
#include "memory/tracker.h"
#include "zero/step_timings.h"
#include "zero/update_applier.h"

namespace zero {

struct OffloadConfig {
  bool pinned_staging = true;  // staging from Device::allocate_host_staging; else pageable host memory
  memory::MemoryTracker* host_tracker = nullptr;  // the host tier's (master, state, staging)
  StepTimings* timings = nullptr;                 // where the copy and CPU times are added (optional)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class OffloadPipeline final : public UpdateApplier {
 public:
  OffloadPipeline(const ApplierInputs& in, const OffloadConfig& config);
  ~OffloadPipeline() override;

  void apply(const GradReducer& grads, float grad_scale, ParamWriteback& writeback) override;
  ShardOptimizer& optimizer() override { return *optimizer_; }
  void read_master(size_t begin, size_t n, float* out) override;
  float* host_master() override { return master_.as<float>(); }
  void write_master(size_t begin, size_t n, const float* in) override;
  void publish_master(ParamWriteback& writeback) override;

 private:
  struct Slot {
    memory::Buffer grad, params;  // staging: one bucket's owned gradient shard, its new values
    std::unique_ptr<memory::Event> grad_landed, params_sent;
    bool sending = false;  // params_sent recorded and not yet waited for
  };
  void copy_grad_in(const GradReducer& grads, size_t b, Slot& slot);
  void prepare(const GradReducer& grads, float grad_scale, double& cpu_s);
  void wait(const memory::Event& e);
  // Copy-stream time, measured on the stream itself: starts and stops a stopwatch in stream order.
  void time_on(memory::Stream& stream, double* total, std::function<void()> work);

  const ShardLayout& layout_;
  const ShardOwnership& ownership_;
  memory::Device& device_;
  OffloadConfig config_;
  std::unique_ptr<memory::Device> host_;  // the host tier: inline streams on the calling thread
  memory::Buffer master_;
  OwnedExchanges exchanges_;  // Muon's and Adafactor's (null without); the optimizer uses them
  std::unique_ptr<ShardOptimizer> optimizer_;
  std::unique_ptr<memory::Stream> d2h_, h2d_;
  std::unique_ptr<memory::Event> grads_ready_, out_free_;
  std::array<Slot, 2> slots_;
  // Per bucket, the element ranges of its owned range that no tensor holds (alignment and chunk
  // padding), relative to the range's start: zeroed in the staging before its new values go back,
  // since the optimizer writes only tensors and the staging last held another bucket.
  std::vector<std::vector<std::pair<size_t, size_t>>> padding_;
  double d2h_s_ = 0, h2d_s_ = 0;  // written on the copy streams, read after their events
};

}  // namespace zero
