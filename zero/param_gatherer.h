#pragma once
// ParamGatherer (stage 3): the rank's shard of every unit's parameters, and the gather window that
// holds whole units while their scopes run.
//
// Each unit is one bucket of the layout (ShardLayout unit_buckets): one flat parameter in N equal
// padded chunks, all-gathered in one collective into a slot of the window. The window is one pool
// allocated at construction (slots of the largest unit; its size is the cap on gathered bytes), so
// no step allocates. A slot keeps its unit after the scope ends until the slot is needed again or the
// step's update makes it stale, so a unit gathered for forward serves its backward when the window
// has room.
//
// Prefetch. The first step records the order in which units are asked for (forward and backward);
// at its end the ranks check they recorded the same order. Later steps issue the next units'
// all-gathers as soon as the current one is asked for, up to the prefetch budget and the free slots.
// A unit asked for out of that order switches the rest of the step to on-demand gathers, logs one
// line, and the new order is recorded for the next step.
//
// Agreement. Every all-gather is labelled with its unit ("unit 3 forward", comm::CallLabel), which
// the communicator's schedule check compares across ranks with the call itself: ranks that ask for
// different units at the same point (even units of the same size) fail at once, each naming every
// rank's unit, instead of silently exchanging the chunks of different units. A failed gather's
// error names this rank's unit too. At the step's end the ranks compare a hash of the order they
// followed (one tiny all-gather), which also catches a difference that moved no data (a unit served
// from the window on one rank and gathered on another).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/step_timings.h"

namespace zero {

struct GathererConfig {
  DType model_dtype = DType::kFloat32;
  bool reshard_after_forward = true;
  size_t prefetch_bytes = 0;           // 0: one unit ahead
  size_t max_live_bytes = 0;           // 0: two of the largest unit
  size_t persistence_bytes = 0;        // units this small stay gathered for the rest of the step
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  StepTimings* timings = nullptr;  // where waits and bytes are added (optional)
  // Parameter offload: the shard lives in page-locked host memory accounted in this tracker (the
  // offload tier's). Each gather first copies the unit's chunk host-to-device into its place in the
  // window slot, on a copy stream of its own, and all-gathers in place; a prefetch brings the chunk
  // over as early as it issues the gather.
  memory::MemoryTracker* offload_tracker = nullptr;
};

class ParamGatherer {
 public:
  // `initial` holds each layout tensor's registered values (model dtype), read once for the shard.
  // Throws InvalidArgument naming EngineOptions.max_live_gathered_bytes when the window cannot hold
  // the largest unit.
  ParamGatherer(const GathererConfig& config, const ShardLayout& layout, const ShardOwnership& ownership,
                comm::Communicator& shard_comm, memory::Device& device, const std::vector<const void*>& initial);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Unit `b` (a bucket index) is gathered and stays until release(b): returns its full parameters
  // (model dtype, indexed from the bucket's flat start), valid until then.
  void* acquire(size_t b, bool backward);
  void release(size_t b, bool backward);
  // The rank's parameter shard (model dtype) in optimizer-space order: where the update writes.
  // Host memory with parameter offload.
  void* shard() { return shard_.data(); }
  // After the update: every gathered copy is stale. Closes the first step's order recording (a
  // collective check across ranks) and prefetches the next step's first unit.
  void after_step();
  // The shard was rewritten outside a step (a checkpoint load): every gathered copy is stale.
  void invalidate();

  size_t window_bytes() const { return window_.size_bytes(); }

 private:
  struct Slot {
    int bucket = -1;   // the unit it holds, or -1
    bool valid = false;  // its data is current (gathered after the last update)
    int users = 0;     // open scopes
    bool persistent = false;
    bool backward = false;  // the gather was issued for a backward scope (for its label)
    uint64_t last_use = 0;
    comm::WorkHandle data_work;
  };
  int find(size_t b) const;
  // `sooner`: units (buckets) needed before the one a slot is wanted for, which must not be evicted.
  int free_slot(const std::vector<int>& sooner = {});
  void issue(size_t b, bool backward, int slot);
  void finish(int slot);  // waits for the slot's gather; a failure names the unit
  std::string unit_label(size_t b, bool backward) const;  // "unit 3 forward"
  // An entry of the recorded order (bucket * 2 + backward) as unit_label names it.
  std::string entry_label(int64_t entry) const { return unit_label(static_cast<size_t>(entry / 2), entry % 2 != 0); }
  void prefetch_from(size_t position);
  bool same_order_everywhere();  // collective: every rank followed the same unit order this step
  size_t unit_bytes(size_t b) const;

  GathererConfig config_;
  const ShardLayout& layout_;
  comm::Communicator& comm_;
  memory::Device& device_;
  CollectiveOrder order_;
  memory::Buffer shard_;   // every unit's chunk of this rank, back to back (kParams)
  std::unique_ptr<memory::Stream> h2d_;  // parameter offload: the shard chunks' copies
  std::unique_ptr<memory::Event> slot_free_;
  memory::Buffer window_;  // slots x the largest padded unit (kGatherWindow)
  memory::Buffer hash_send_, hash_recv_, hash_host_;  // the step's order check
  std::vector<Slot> slots_;
  size_t slot_elems_ = 0;
  uint64_t clock_ = 0;
  // Unit order: recorded_ (agreed, used for prefetch) and this step's actual sequence.
  std::vector<int64_t> recorded_, current_;
  bool order_agreed_ = false;
  bool on_demand_ = false;  // this step left the recorded order
  size_t position_ = 0;     // next expected entry of recorded_
};

}  // namespace zero
