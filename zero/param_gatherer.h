#pragma once
// ParamGatherer (stage 3): the rank's shard of every unit's parameters, and the gather window that
// holds whole units while their scopes run.
//
// Each unit is one bucket of the layout (ShardLayout unit_buckets): one flat parameter in N equal
// padded chunks, all-gathered in one collective into a buffer of its own size. (A unit whose
// parameters have two dtypes is two buckets, one gather each; prefetch counts units, not buckets.)
// The window is a BufferCache (memory/buffer_cache.h): each unit's buffer a range of one slab,
// reserved at the window's limit (or every unit, when they all fit in less) and placed as planned
// from the first steps' trace. What is live:
//
//   the units whose scopes are open
//   + the units prefetched ahead of use (within EngineOptions.prefetch_bytes)
//   + the units kept on purpose: reshard_after_forward = false (forward kept for backward),
//     param_persistence_bytes (small units for the rest of the step)
//   + the units kept while there is room: a unit the recorded order asks for again later in the
//     step (each forward, for its backward) stays after its scope ends, as DeepSpeed's reuse
//     distance keeps it, until room is needed
//
// and their total never exceeds EngineOptions.max_live_gathered_bytes, the knob that trades
// memory for gathers. Any other unit leaves the window when its scope ends.
//
// Room is never refused while it could be freed. When the unit asked for does not fit, the window
// evicts, in turn: kept units not held by a scope (least recently used first), then prefetches in
// flight (waited for first: an order change can leave every other unit an unneeded prefetch). Only
// the units of open scopes are never evicted; if they and the unit asked for exceed the limit, the
// error names them and the option. Prefetch never evicts a unit that is needed before the one it
// fetches, nor one held or in flight, so it cannot take the room of the unit asked for next.
//
// Prefetch. The first step records the order in which units are asked for (forward and backward);
// at its end the ranks check they recorded the same order. Later steps issue the next units'
// all-gathers as soon as the current one is asked for, up to the prefetch budget. A unit asked for
// out of that order switches the rest of the step to on-demand gathers, logs one line, and the new
// order is recorded for the next step. Evaluation (forward-only passes: validation, sampling) is not
// recorded: it prefetches along the forward entries of the recorded order, and the next training
// step still follows the recorded order.
//
// Agreement. Every all-gather is labelled with its unit ("unit 3 forward", comm::CallLabel), which
// the communicator's schedule check compares across ranks with the call itself: ranks that ask for
// different units at the same point (even units of the same size) fail at once, each naming every
// rank's unit, instead of silently exchanging the chunks of different units. A failed gather's
// error names this rank's unit too. At the step's end the ranks compare a hash of the order they
// followed (one tiny all-gather), which also catches a difference that moved no data (a unit served
// from the window on one rank and gathered on another).
//
// Secondary shards (ZeRO++'s hpZ, GathererConfig::node). When a unit's training forward gather is
// in, each rank copies its node's part of it (1 / node size of the unit: the part its local index
// names) into a buffer of its own, which stays to the step's end whatever the window does with the
// unit. The unit's backward gather then all-gathers those parts inside the node, so that the values
// the backward reads are the forward's, bit for bit (dequantized ones included), and only the
// forward's gather crosses nodes. Without a part (a backward that no forward preceded) the backward
// gathers from the shard as before; every rank decides alike, as they follow the same order.
//
// Quantized gathers (ZeRO++'s qwZ, GathererConfig::quantized). A unit's gather quantizes this
// rank's chunk into its place in a buffer of every rank's segment (memory/block_quantization.h),
// all-gathers the segments as bytes in place, and once they are in dequantizes all of them (this
// rank's too, so that every rank computes with the same values) into the unit's buffer in the
// window, on the compute stream that waits for the gather anyway. The segments' buffers come from
// a cache of their own (comm buffers), given back as the dequantization is issued. A non-finite
// parameter comes back as NaN in its own element only, and is counted per unit; the step's order
// check carries each rank's count, so that every rank stops together naming the ranks and units
// that held one instead of training on.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/block_quantization.h"
#include "memory/buffer_cache.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/step_timings.h"

namespace zero {

// A tensor's registered values, read once for the shard (converted to its layout dtype, the one the
// shard and the gathered units hold: param_dtype).
struct RegisteredValues {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
};

struct GathererConfig {
  bool reshard_after_forward = true;
  size_t prefetch_bytes = 0;           // 0: one unit ahead
  size_t max_live_bytes = 0;           // 0: two of the largest unit
  size_t persistence_bytes = 0;        // units this small stay gathered for the rest of the step
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  StepTimings* timings = nullptr;  // where a step's waits and bytes are added (optional)
  // Parameter offload: the shard lives in page-locked host memory accounted in this tracker (the
  // offload tier's). Each gather first copies the unit's chunk host-to-device into its place in the
  // unit's window buffer, on a copy stream of its own, and all-gathers in place; a prefetch brings
  // the chunk over as early as it issues the gather.
  memory::MemoryTracker* offload_tracker = nullptr;
  // Quantized gathers (see the top comment): empty, full precision. `quantize_backward`: the
  // backward's gathers too; `quantize_evaluation`: the evaluations' too (the training forward's
  // always).
  std::optional<memory::BlockQuantization> quantized;
  bool quantize_backward = true;
  bool quantize_evaluation = false;  // evaluations' gathers too
  // hpZ (see the top comment): this rank's node within the shard group (consecutive ranks); null:
  // off.
  comm::Communicator* node = nullptr;
};

// What a scope is for: a training forward or backward (recorded in the unit order) or an
// evaluation forward (not recorded).
enum class GatherUse { kForward, kBackward, kEvaluation };

class ParamGatherer {
 public:
  // `initial` holds each layout tensor's registered values, read once for the shard.
  // Throws InvalidArgument naming EngineOptions.max_live_gathered_bytes when the window cannot hold
  // the largest unit.
  ParamGatherer(const GathererConfig& config, const ShardLayout& layout, const ShardOwnership& ownership,
                comm::Communicator& shard_comm, memory::Device& device, const std::vector<RegisteredValues>& initial);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Unit `b` (a bucket index) is gathered and stays until release(b): returns its full parameters
  // (the bucket's dtype, indexed from its flat start), valid until then.
  void* acquire(size_t b, GatherUse use);
  void release(size_t b, GatherUse use);
  // Unit `b`'s gathered parameters, between acquire(b) and release(b).
  void* gathered(size_t b);
  // Evaluation passes between (or inside) training steps: scopes opened with GatherUse::kEvaluation
  // follow the recorded forward order; ending restores the training step's place in its order.
  void begin_evaluation();
  void end_evaluation();
  // The rank's parameter shard in optimizer-space order, each bucket's chunk in its dtype
  // (ShardLayout::shard_bytes): where the update writes.
  // Host memory with parameter offload.
  void* shard() { return shard_.data(); }
  // After the update: every gathered copy is stale. Closes the first step's order recording (a
  // collective check across ranks) and prefetches the next step's first unit.
  void after_step();
  // The shard was rewritten outside a step (a checkpoint load): every gathered copy is stale.
  void invalidate();
  // The most bytes of gathered units resident at once so far (what the limit and the prefetch budget
  // bound; the window's memory is its slab).
  size_t peak_resident_bytes() const { return window_.peak_live_bytes(); }
  // hpZ: the bytes of every unit's node part together, what this rank holds after a full forward
  // (0 without node parts).
  uint64_t node_parts_bytes() const;

 private:
  struct Unit {
    memory::Buffer data;    // the gathered copy (or the one being gathered); empty: not resident
    memory::Buffer segments;  // quantized gathers: every rank's segment, until dequantized into data
    memory::Buffer secondary;  // hpZ: this rank's part of the forward's values; survives eviction
    bool in_node = false;      // the gather in flight runs inside the node (from the parts)
    bool valid = false;     // gathered after the last update
    int users = 0;          // open scopes
    bool persistent = false;  // kept to the step's end (persistence bytes, or forward kept for backward)
    GatherUse use = GatherUse::kForward;  // what the gather was issued for (its label)
    uint64_t last_use = 0;
    uint64_t issued = 0;    // when its gather was issued (eviction of prefetches: latest first)
    comm::WorkHandle work;
  };
  // The order being followed: the recorded one while training, its forward entries in evaluation.
  struct Follow {
    const std::vector<int64_t>* order = nullptr;
    size_t position = 0;     // next expected entry
    bool on_demand = false;  // this pass left the order
  };
  bool resident(size_t b) const { return !units_[b].data.empty(); }
  // Frees room for `bytes` by evicting units not held by a scope (see the top comment); false when
  // even that is not enough.
  bool make_room(size_t bytes, size_t for_bucket);
  // Prefetch's room: only idle kept units that are not in `sooner` may go.
  bool make_prefetch_room(size_t bytes, const std::vector<size_t>& sooner);
  void evict(size_t b);  // drops a resident unit not held by a scope (its gather finished first)
  void issue(size_t b, GatherUse use, bool ahead);
  // Where waits and bytes go: the step's timings, but not an evaluation's (it belongs to no step).
  StepTimings* timings() const { return evaluating_ ? nullptr : config_.timings; }
  void finish(size_t b);  // waits for the unit's gather; a failure names the unit
  std::string unit_label(size_t b, GatherUse use) const;  // "unit 3 forward"
  // An entry of the recorded order (bucket * 2 + backward) as unit_label names it.
  std::string entry_label(int64_t entry) const;
  void follow(int64_t entry);
  void prefetch();
  bool next_entry_is(size_t b) const;  // the order followed (or training's) needs unit b next
  bool needed_later(size_t b) const;   // the rest of the order followed asks for unit b again
  // Collective: every rank followed the same unit order this step. With quantized gathers it also
  // brings every rank's non-finite counts and throws Error on every rank alike, naming each rank
  // and unit that held one.
  bool same_order_everywhere();
  bool quantizes(GatherUse use) const;
  size_t check_slots() const { return 1 + (config_.quantized ? units_.size() : 0); }  // int64s per rank
  size_t unit_bytes(size_t b) const;
  // hpZ: elements of bucket b in one node part, and where this rank's starts.
  size_t part_numel(size_t b) const { return layout_.buckets()[b].padded / static_cast<size_t>(config_.node->size()); }
  void keep_node_part(size_t b);
  void drop_node_parts();
  std::string held_units() const;

  GathererConfig config_;
  const ShardLayout& layout_;
  comm::Communicator& comm_;
  memory::Device& device_;
  CollectiveOrder order_;
  memory::Buffer shard_;   // every unit's chunk of this rank, back to back (kParams)
  std::unique_ptr<memory::Stream> h2d_;  // parameter offload: the shard chunks' copies
  std::unique_ptr<memory::Event> slot_free_;
  memory::BufferCache window_;  // the gathered units (kGatherWindow)
  memory::BufferCache segments_;  // quantized gathers: the units' segments in flight (kCommBuffer)
  memory::BufferCache secondaries_;  // hpZ: the units' node parts (kSecondaryShard)
  std::unique_ptr<CollectiveOrder> node_order_;  // hpZ: the node group's gathers
  size_t cap_ = 0;
  // The step's order check: this rank's hash, then with quantized gathers its non-finite count per
  // bucket (the quantizer adds into them on the device), every rank's gathered.
  memory::Buffer hash_send_, hash_recv_, hash_host_;
  std::vector<Unit> units_;  // by bucket
  uint64_t clock_ = 0;
  // Unit order: recorded_ (agreed, used for prefetch), its forward entries (evaluation), and this
  // step's actual sequence.
  std::vector<int64_t> recorded_, recorded_forward_, current_;
  bool order_agreed_ = false;
  Follow training_, evaluation_;
  bool evaluating_ = false;
};

}  // namespace zero
