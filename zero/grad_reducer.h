#pragma once
// GradReducer: from "the gradient of tensor t is complete" to reduced gradients in the rank's
// owned ranges.
//
// Backward accumulates (+=) each tensor's gradient into grad(t). When every tensor of a bucket is
// complete the bucket's collective starts (while backward goes on), in one fixed order on every rank
// (last bucket first, as backward produces them), so ranks always agree on the sequence whatever
// order their completions came in. The collective follows the ownership: all-reduce when every rank
// owns every bucket, reduce-scatter into the rank's chunk when sharded; then, with a replica
// communicator (hybrid sharding), an all-reduce of the chunk across replicas. Deterministic mode
// replaces each sum with an all-to-all and a local sum in global rank order.
//
// Where grad(t) points (one rule at every stage): into the full flat gradient buffer when there is
// one, otherwise into the bucket's staging buffer (a tensor spanning buckets gets a contiguous scratch
// copied in when it completes). Either way it is valid until tensor t is marked complete or the
// micro-step ends, and not after.
//
// Buffers. Staging, conversion and deterministic receive buffers are each exactly their bucket's
// (or piece's) size, taken from a BufferCache when a bucket starts and given back when its
// reduction completes: what they hold is the gradients of the buckets in flight, not slots of the
// largest bucket.
//
// Micro-steps. A micro-step either reduces ("sync") or, like DDP's no_sync, only accumulates locally
// into the full flat buffer (allocated on first use when the configuration keeps none), which is
// then reduced at the next sync micro-step. Reduced gradients either stay in the full buffer (one
// micro-step, stages 0/1: no copy) or accumulate into the shard accumulator.
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
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

// Gradients are written in each tensor's layout dtype (ShardLayout::Tensor::dtype; a bucket has one).
// The reduce and accumulate dtypes are one for all buckets, or (nullopt) each bucket's own: a model
// of bf16 matrices and fp32 biases then keeps bf16 gradients bf16 and fp32 ones fp32.
struct ReducerConfig {
  std::optional<DType> reduce_dtype = DType::kFloat32;  // what the collectives sum
  bool full_grads = true;                // keep a full flat gradient buffer for the whole run
  bool accumulate = false;               // reduced gradients accumulate into a shard accumulator
  std::optional<DType> accum_dtype = DType::kFloat32;
  bool deterministic = false;
  int max_inflight = 2;                  // bucket reductions in flight at once
  // A bucket that needs a buffer of its own for the collective (a reduce dtype other than the
  // bucket's, or deterministic mode) and holds more than this many elements is reduced in pieces of at
  // most this many (sharded ownership only: stage 3's units, which can be far larger than a bucket),
  // so that buffer stays bounded. 0: never in pieces.
  size_t piece_numel = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  StepTimings* timings = nullptr;  // where waits and bytes are added (optional)
  // Pipeline micro-batches reduced one by one (buckets are whole units, and accumulate): a bucket
  // launches as soon as it is complete, in completion order (every data-parallel rank of a pipeline
  // stage runs the same schedule, hence the same order), and begin_round() opens it again for the
  // unit's next micro-batch within the same micro-step.
  bool rounds = false;
  // qgZ (EngineOptions.quantized_gradients): sharded buckets reduced as quantized blocks in two
  // all-to-alls, inside the node (ReducerComms::node) then across nodes (across_nodes), each followed
  // by a dequantized fp32 sum in rank order; the result lands where the reduce-scatter's would. Replaces
  // the reduce-scatter and deterministic mode's all-to-all (its sums are ordered too).
  std::optional<memory::BlockQuantization> quantized;
  bool stochastic_rounding = false;  // qgZ's codes rounded stochastically (EngineOptions)
};

// User-provided gradient storage of one tensor (ParamSpec::grad), or null: the engine provides it.
struct UserGrad {
  void* ptr = nullptr;
};

struct ReducerComms {
  comm::Communicator* shard = nullptr;    // the group a bucket is reduced (and sharded) within
  comm::Communicator* replica = nullptr;  // optional: replicas of the same shard (hybrid sharding)
  // qgZ only: this rank's node within `shard` (consecutive ranks) and its peers of the same place
  // on the other nodes (null on one node).
  comm::Communicator* node = nullptr;
  comm::Communicator* across_nodes = nullptr;
};

class GradReducer {
 public:
  GradReducer(const ReducerConfig& config, const ShardLayout& layout, const ShardOwnership& ownership,
              ReducerComms comms, memory::Device& device, std::vector<UserGrad> user_grads);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Opens a micro-step (no-op if one is open): `sync` says whether it reduces.
  void begin_micro_step(bool sync);
  // The step and micro-step the next reductions belong to: qgZ's stochastic rounding keys its draws
  // with them (so a resumed run draws as the uninterrupted one).
  void set_step(int64_t step, int64_t micro_step);
  bool micro_step_open() const { return open_; }
  bool micro_step_syncs() const { return sync_; }
  // Where backward accumulates tensor t's gradient in this micro-step (see the header comment).
  void* grad(size_t t);
  // Tensor t's gradient is complete for this micro-step; its buckets may start reducing.
  void tensor_ready(size_t t);
  // ReducerConfig::rounds: bucket b (a unit) takes gradients again, for its next micro-batch. If it
  // was launched in this micro-step, its reduction is completed first (it has added into the
  // accumulator) and its tensors are open again; otherwise nothing changes.
  void begin_round(size_t b);
  bool is_ready(size_t t) const { return ready_[t] != 0; }
  // Ends the micro-step: a sync micro-step reduces what is still pending and waits for all of it;
  // afterwards the compute stream is ordered after the reductions.
  void end_micro_step();
  // Local gradients accumulated by no-sync micro-steps and not reduced yet.
  bool holds_unreduced() const { return unreduced_; }

  // The reduced gradient of bucket b's owned range (ShardOwnership::range), after a sync micro-step.
  struct Reduced {
    const void* ptr = nullptr;
    DType dtype = DType::kFloat32;
  };
  Reduced reduced(size_t b) const;
  // The dtype of reduced(b), known before any step (the accumulator's, else the bucket's).
  DType reduced_dtype(size_t b) const { return config_.accumulate ? accum_dtype(b) : layout_.buckets()[b].dtype; }
  // Zeroes every gradient (buffers and user storage) on the compute stream, for the next step.
  void clear();

  size_t num_tensors() const { return ready_.size(); }

 private:
  struct Slot;
  struct BucketState;
  // One collective's share of bucket b: every rank's elements [begin, begin + len) of its chunk, in
  // `cbuf` rank after rank (the whole bucket, in place, when it goes in one piece).
  struct Piece {
    void* cbuf = nullptr;
    size_t begin = 0;
    size_t len = 0;
  };
  // The key of one quantization's stochastic draws (0 where rounding is to nearest): row `row` of
  // bucket b's piece in hop `hop` (0 inside the node, 1 across), this step, this rank.
  uint64_t rounding_key(size_t b, const Piece& piece, size_t row, int hop) const;
  uint64_t step_key_ = 0;  // set_step's

  void* bucket_buffer(size_t b);  // bucket b's gradients in its dtype (full buffer or staging)
  void* in_full(size_t b, size_t flat);  // flat element `flat` of bucket b in the full buffer
  DType reduce_dtype(size_t b) const { return config_.reduce_dtype.value_or(layout_.buckets()[b].dtype); }
  DType accum_dtype(size_t b) const { return config_.accum_dtype.value_or(layout_.buckets()[b].dtype); }
  // Where optimizer-space element `opt` of bucket b sits in the accumulator, in bytes.
  size_t accum_offset(size_t b, size_t opt) const;
  bool uses_full() const { return !full_.empty() && (config_.full_grads || unreduced_ || !sync_); }
  void ensure_full();
  void stage_tensor(size_t t);
  void launch_ready();
  void launch(size_t b);
  void launch_in_pieces(size_t b, const void* grads);
  comm::WorkHandle issue(size_t b, const Piece& piece);
  // qgZ: the first hop (quantize every rank's row, all-to-all inside the node), and once it is in
  // the rest (sum, quantize, all-to-all across nodes, sum into `chunk`).
  comm::WorkHandle issue_quantized(size_t b, const Piece& piece);
  void finish_quantized(size_t b, const Piece& piece, void* chunk);
  // qgZ's shape for a piece: the shard group's ranks, a node's, the nodes, one row's quantized bytes.
  struct Hops {
    size_t world, local, nodes, seg;
  };
  Hops hops(const Piece& piece) const;
  // "unit U gradients<suffix>" (or "bucket B ..." outside units): what the collective's errors name.
  std::string gradient_label(size_t b, const char* suffix) const;
  // Waits for the piece's collective, finishes its sum (deterministic, replicas) and routes the
  // owned part into the accumulator (or the full buffer).
  void finish(size_t b, const Piece& piece, comm::Work& work);
  void complete(size_t b);
  void complete_all();
  int acquire_slot();
  Slot& slot(int s) { return *slots_[static_cast<size_t>(s)]; }
  void reset_buckets();

  ReducerConfig config_;
  const ShardLayout& layout_;
  const ShardOwnership& ownership_;
  ReducerComms comms_;
  memory::Device& device_;
  std::unique_ptr<memory::Stream> stream_;  // conversions and post-processing around collectives
  std::unique_ptr<memory::Event> event_;
  CollectiveOrder shard_order_;
  std::unique_ptr<CollectiveOrder> replica_order_;
  std::unique_ptr<CollectiveOrder> node_order_, across_order_;  // qgZ's hops
  std::vector<UserGrad> user_grads_;
  memory::BufferCache buffers_;  // staging, conversion and receive buffers (kCommBuffer)

  memory::Buffer full_;   // full flat gradients, each bucket in its dtype
  memory::Buffer accum_;  // shard accumulator, each bucket's range in accum_dtype(b)
  bool accum_has_data_ = false;       // every owned range holds an earlier micro-step's sum
  std::vector<char> bucket_has_data_;  // rounds: bucket b's owned range holds an earlier round's
  memory::BufferCache scratch_cache_;      // scratch_'s memory: staging like buffers_ (kCommBuffer), its own slab
  std::vector<memory::Buffer> scratch_;  // tensors spanning buckets, while staging buffers are used
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> free_slots_;
  std::vector<BucketState> buckets_;
  std::vector<char> ready_;
  size_t launched_ = 0;          // buckets launched this micro-step (last bucket first; rounds: any order)
  std::vector<size_t> inflight_;  // launched, not completed, in launch order
  bool open_ = false;
  bool sync_ = true;
  bool unreduced_ = false;
};

}  // namespace zero
