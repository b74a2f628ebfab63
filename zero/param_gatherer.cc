#include "zero/param_gatherer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/fault_injection.h"
#include "base/logging.h"
#include "zero/rank_agreement.h"

namespace zero {

ParamGatherer::ParamGatherer(const GathererConfig& config, const ShardLayout& layout,
                             const ShardOwnership& ownership, comm::Communicator& shard_comm,
                             memory::Device& device, const std::vector<RegisteredValues>& initial)
    : config_(config), layout_(layout), comm_(shard_comm), device_(device), order_(device, shard_comm, config.timeout),
      window_(device, memory::Category::kGatherWindow), segments_(device, memory::Category::kCommBuffer),
      secondaries_(device, memory::Category::kSecondaryShard) {
  if (config_.quantized) memory::check_block_quantization(*config_.quantized, "EngineOptions.quantized_weights");
  if (config_.node) {
    ZERO_CHECK(shard_comm.size() % config_.node->size() == 0, "a node of {} ranks in a shard group of {}",
               config_.node->size(), shard_comm.size());
    node_order_ = std::make_unique<CollectiveOrder>(device, *config_.node, config.timeout);
  }
  memory::Stream& compute = device_.compute_stream();
  const size_t shard_bytes = layout_.shard_bytes();
  const bool offload = config_.offload_tracker != nullptr;
  if (offload) {
    shard_ = device_.allocate_host_staging(shard_bytes, memory::Category::kParams, *config_.offload_tracker);
    h2d_ = device_.create_stream("parameter offload h2d");
    slot_free_ = device_.create_event();
  } else {
    shard_ = device_.allocate(shard_bytes, memory::Category::kParams);
  }
  // The padding between tensors and at the chunks' ends holds zeros, never what the memory held
  // before: quantized gathers take each block's scale from its largest value, padding included, and
  // every rank must send the same bits for the same data.
  if (offload) {
    std::memset(shard_.data(), 0, shard_bytes);
  } else {
    device_.fill_zero(shard_.data(), shard_bytes, compute);
  }
  // The registered values, each piece converted to its bucket's dtype where that differs
  // (param_dtype) on the device, then copied to the host shard with parameter offload.
  memory::Buffer narrowed;
  for (const OwnedPiece& p : ownership.pieces()) {
    const DType dt = layout_.buckets()[p.bucket].dtype;
    const RegisteredValues& in = initial[p.tensor];
    const char* src = static_cast<const char*>(in.data) + p.tensor_begin * dtype_size(in.dtype);
    const size_t at = layout_.shard_bytes(p.bucket, p.opt_offset), n = p.tensor_end - p.tensor_begin;
    char* dst = shard_.as<char>() + at;
    if (in.dtype == dt) {
      device_.copy(dst, src, n * dtype_size(dt), compute);
      continue;
    }
    if (offload && narrowed.empty()) narrowed = device_.allocate(shard_bytes, memory::Category::kOther);
    device_.convert(src, in.dtype, offload ? narrowed.as<char>() + at : dst, dt, n, compute);
    if (offload) device_.copy(dst, narrowed.as<char>() + at, n * dtype_size(dt), compute);
  }
  if (!narrowed.empty()) device_.synchronize(compute, config_.timeout);  // before `narrowed` is freed
  const size_t largest = layout_.max_bucket_bytes();
  cap_ = config_.max_live_bytes ? config_.max_live_bytes : 2 * largest;
  if (cap_ < largest) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.max_live_gathered_bytes = {} cannot hold the largest unit ({} bytes gathered)", cap_,
               largest);
  }
  // The window's slab, reserved at once: its limit, or every unit when they all fit in less. (Grown
  // from the first steps' plans instead it would hold less where the live peak stays below the limit,
  // but those first steps would have to keep the units past the slab within the limit too, and
  // prefetch less.)
  size_t all_units = 0;
  for (size_t b = 0; b < layout_.buckets().size(); ++b) all_units += memory::BufferCache::placed_bytes(unit_bytes(b));
  window_.limit_to(cap_);
  window_.reserve(std::min(cap_, all_units));

  units_.resize(layout_.buckets().size());
  training_.order = &recorded_;
  evaluation_.order = &recorded_forward_;
  const size_t world = static_cast<size_t>(comm_.size()), slots = check_slots();
  hash_send_ = device_.allocate_elements(static_cast<int64_t>(slots), DType::kInt64, memory::Category::kCommBuffer);
  hash_recv_ =
      device_.allocate_elements(static_cast<int64_t>(world * slots), DType::kInt64, memory::Category::kCommBuffer);
  hash_host_ = device_.allocate_host_staging((world * slots + 1) * sizeof(int64_t), memory::Category::kCommBuffer);
  device_.fill_zero(hash_send_.data(), hash_send_.size_bytes(), compute);  // the non-finite counts start at 0
}

ParamGatherer::~ParamGatherer() {
  // Copies and all-gathers still in flight write into the window: let them finish (or fail) first.
  try {
    if (h2d_) device_.synchronize(*h2d_, config_.timeout);
  } catch (const std::exception& e) {
    ZERO_LOG_WARN("engine destroyed with a failed parameter copy in flight: {}", e.what());
  }
  for (Unit& u : units_) {
    try {
      if (u.work) u.work->wait(config_.timeout);
    } catch (const std::exception& e) {
      ZERO_LOG_WARN("engine destroyed with a failed parameter all-gather in flight: {}", e.what());
    }
  }
}

size_t ParamGatherer::unit_bytes(size_t b) const { return layout_.bucket_bytes(b); }

std::string ParamGatherer::unit_label(size_t b, GatherUse use) const {
  const char* what = use == GatherUse::kBackward ? "backward" : use == GatherUse::kForward ? "forward" : "evaluation";
  const auto& B = layout_.buckets()[b];
  if (layout_.mixed_dtypes()) return fmt::format("unit {} {} ({} part)", B.unit, what, dtype_name(B.dtype));
  return fmt::format("unit {} {}", B.unit, what);
}

std::string ParamGatherer::entry_label(int64_t entry) const {
  return unit_label(static_cast<size_t>(entry / 2), entry % 2 != 0 ? GatherUse::kBackward : GatherUse::kForward);
}

std::string ParamGatherer::held_units() const {
  std::string out;
  for (size_t b = 0; b < units_.size(); ++b) {
    if (units_[b].users == 0) continue;
    out += fmt::format("{}unit {} ({} bytes)", out.empty() ? "" : ", ", layout_.buckets()[b].unit, unit_bytes(b));
  }
  return out.empty() ? "none" : out;
}

void ParamGatherer::evict(size_t b) {
  Unit& u = units_[b];
  ZERO_CHECK_EQ(u.users, 0, "unit bucket {} evicted while a scope holds it", b);
  if (u.work) finish(b);
  // The compute stream was the last to read it; the next gather into the buffer is ordered after
  // the compute stream's work (before_issue).
  window_.give(std::move(u.data), device_.compute_stream());
  memory::Buffer part = std::move(u.secondary);
  u = Unit{};
  u.secondary = std::move(part);
}

uint64_t ParamGatherer::node_parts_bytes() const {
  if (!config_.node) return 0;
  uint64_t bytes = 0;
  for (size_t b = 0; b < units_.size(); ++b) bytes += part_numel(b) * dtype_size(layout_.buckets()[b].dtype);
  return bytes;
}

void ParamGatherer::keep_node_part(size_t b) {
  Unit& u = units_[b];
  const size_t es = dtype_size(layout_.buckets()[b].dtype), n = part_numel(b) * es;
  memory::Stream& compute = device_.compute_stream();
  u.secondary = secondaries_.take(n, compute);
  device_.copy(u.secondary.data(), u.data.as<char>() + static_cast<size_t>(config_.node->rank()) * n, n, compute);
}

void ParamGatherer::drop_node_parts() {
  for (Unit& u : units_) {
    if (!u.secondary.empty()) secondaries_.give(std::move(u.secondary), device_.compute_stream());
  }
}

bool ParamGatherer::make_room(size_t bytes, size_t for_bucket) {
  // Room is bytes under the limit and a hole in the window's slab: evicting may be needed for the
  // second alone (fragmentation).
  while (window_.live_bytes() + bytes > cap_ || !window_.fits(bytes)) {
    // Kept units first (least recently used), then prefetches in flight (the latest issued first:
    // the one needed last).
    int best = -1;
    auto better = [&](size_t b) {
      if (best < 0) return true;
      const Unit& x = units_[b];
      const Unit& y = units_[static_cast<size_t>(best)];
      if (static_cast<bool>(x.work) != static_cast<bool>(y.work)) return !x.work;
      return x.work ? x.issued > y.issued : x.last_use < y.last_use;
    };
    for (size_t b = 0; b < units_.size(); ++b) {
      if (b == for_bucket || !resident(b) || units_[b].users > 0) continue;
      if (better(b)) best = static_cast<int>(b);
    }
    // Nothing left to evict: within the limit, the units in use leave no hole, and the unit goes
    // past the slab on memory of its own.
    if (best < 0) return window_.live_bytes() + bytes <= cap_;
    evict(static_cast<size_t>(best));
  }
  return true;
}

bool ParamGatherer::make_prefetch_room(size_t bytes, const std::vector<size_t>& sooner) {
  while (window_.live_bytes() + bytes > cap_ || !window_.fits(bytes)) {
    int best = -1;
    for (size_t b = 0; b < units_.size(); ++b) {
      const Unit& x = units_[b];
      if (!resident(b) || x.users > 0 || x.work) continue;
      if (std::find(sooner.begin(), sooner.end(), b) != sooner.end()) continue;
      if (best < 0 || x.last_use < units_[static_cast<size_t>(best)].last_use) best = static_cast<int>(b);
    }
    if (best < 0) return false;
    evict(static_cast<size_t>(best));
  }
  return true;
}

bool ParamGatherer::quantizes(GatherUse use) const {
  if (!config_.quantized) return false;
  if (use == GatherUse::kBackward) return config_.quantize_backward;
  return use == GatherUse::kForward || config_.quantize_evaluation;
}

void ParamGatherer::issue(size_t b, GatherUse use, bool ahead) {
  Unit& u = units_[b];
  const auto& B = layout_.buckets()[b];
  const size_t es = dtype_size(B.dtype);
  const size_t rank = static_cast<size_t>(comm_.rank()), world = static_cast<size_t>(comm_.size());
  memory::Stream& compute = device_.compute_stream();
  u.data = window_.take(unit_bytes(b), compute);
  u.use = use;
  u.issued = ++clock_;
  char* full = static_cast<char*>(u.data.data());
  if (use == GatherUse::kBackward && !u.secondary.empty()) {
    // hpZ: the node's parts of the forward's values, gathered inside the node (the compute stream
    // wrote the parts and last read the buffer's previous unit).
    comm::Communicator& node = *config_.node;
    node_order_->before_issue(compute);
    comm::CallLabel label(node, unit_label(b, use) + " in node");
    u.work = node.all_gather(u.secondary.data(), full, part_numel(b), B.dtype);
    u.in_node = true;
    if (StepTimings* t = timings()) {
      const uint64_t moved = B.padded * es;
      t->gathered_bytes += moved;
      if (ahead) t->prefetched_bytes += moved;
    }
    return;
  }
  const char* send = shard_.as<char>() + B.shard_bytes;
  // The shard was last written by the update on the compute stream.
  memory::Stream* producer = &compute;
  if (h2d_) {
    // Parameter offload: the chunk comes over into its own place in the buffer (in place all-gather)
    // once the compute stream is done with the buffer's previous unit and with the update that wrote
    // the shard.
    char* own = full + rank * B.chunk * es;
    device_.record(*slot_free_, compute);
    device_.wait(*h2d_, *slot_free_);
    device_.copy(own, send, B.chunk * es, *h2d_);
    producer = h2d_.get();
    send = own;
  }
  void* recv = full;
  size_t count = B.chunk;
  DType dtype = B.dtype;
  if (quantizes(use)) {
    // This rank's segment, quantized into its own place among every rank's (in place all-gather),
    // counting its non-finite values into the step's check.
    const memory::BlockQuantization& q = *config_.quantized;
    const size_t segment = q.segment_bytes(B.chunk);
    u.segments = segments_.take(segment * world, *producer);
    char* mine = u.segments.as<char>() + rank * segment;
    auto* counts = reinterpret_cast<uint64_t*>(hash_send_.as<int64_t>() + 1);
    device_.quantize_blocks(send, B.dtype, B.chunk, q, mine, counts + b, *producer);
    send = mine;
    recv = u.segments.data();
    count = segment;
    dtype = DType::kUInt8;
  }
  order_.before_issue(*producer);
  // The unit travels in the schedule check's record: ranks that gather different units here (even
  // units of the same size) fail with the communicator's mismatch error, which names each rank's
  // unit, before any data is used.
  comm::CallLabel label(comm_, unit_label(b, use));
  u.work = comm_.all_gather(send, recv, count, dtype);
  if (StepTimings* t = timings()) {
    const uint64_t moved = count * dtype_size(dtype) * world;
    t->gathered_bytes += moved;
    if (ahead) t->prefetched_bytes += moved;
  }
}

void ParamGatherer::finish(size_t b) {
  Unit& u = units_[b];
  if (!u.work) return;
  ScopedTimer waiting(timings() ? &timings()->gather_wait_s : nullptr);
  memory::Stream& compute = device_.compute_stream();
  try {
    (u.in_node ? *node_order_ : order_).after(*u.work, compute);
  } catch (const Error& e) {
    const std::string what = fmt::format("stage 3: the all-gather of {} failed: {}", unit_label(b, u.use), e.what());
    u.work.reset();
    if (!u.segments.empty()) segments_.give(std::move(u.segments), compute);
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(what);
    throw CommError(what);
  }
  u.work.reset();
  u.in_node = false;
  if (!u.segments.empty()) {
    // Every rank's segment (this one's too) into the unit's buffer, where the compute reads it.
    const auto& B = layout_.buckets()[b];
    const memory::BlockQuantization& q = *config_.quantized;
    const size_t segment = q.segment_bytes(B.chunk);
    device_.dequantize_rows(u.segments.data(), segment, static_cast<size_t>(comm_.size()), B.chunk, q, u.data.data(),
                            B.dtype, B.chunk, compute);
    segments_.give(std::move(u.segments), compute);
  }
  if (config_.node && u.use == GatherUse::kForward && u.secondary.empty()) keep_node_part(b);
}

void ParamGatherer::follow(int64_t entry) {
  Follow& f = evaluating_ ? evaluation_ : training_;
  if (!order_agreed_ || f.on_demand) return;
  const std::vector<int64_t>& order = *f.order;
  if (f.position < order.size() && order[f.position] == entry) {
    ++f.position;
    return;
  }
  f.on_demand = true;
  if (evaluating_) {
    ZERO_LOG_DEBUG("stage 3: evaluation asked for {} where the recorded forward order has {}: it gathers on demand",
                   entry_label(entry), f.position < order.size() ? entry_label(order[f.position]) : "its end");
    return;
  }
  ZERO_LOG_INFO("stage 3: {} asked for at position {} of the step, where the recorded order has {}: the rest "
                "of this step gathers on demand, and the new order is recorded",
                entry_label(entry), f.position,
                f.position < order.size() ? entry_label(order[f.position]) : "the end of the step");
}

bool ParamGatherer::next_entry_is(size_t b) const {
  auto next_in = [&](const Follow& f) {
    return order_agreed_ && !f.on_demand && f.position < f.order->size() &&
           static_cast<size_t>((*f.order)[f.position] / 2) == b;
  };
  // An evaluation keeps what training needs next too (the next step's first unit, prefetched).
  return next_in(evaluating_ ? evaluation_ : training_) || (evaluating_ && next_in(training_));
}

void* ParamGatherer::acquire(size_t b, GatherUse use) {
  ZERO_CHECK(evaluating_ == (use == GatherUse::kEvaluation), "a {} scope {} an evaluation",
             use == GatherUse::kEvaluation ? "evaluation" : "training", evaluating_ ? "inside" : "outside");
  const int64_t entry = static_cast<int64_t>(b) * 2 + (use == GatherUse::kBackward ? 1 : 0);
  if (!evaluating_) current_.push_back(entry);
  follow(entry);
  if (!resident(b) && !make_room(unit_bytes(b), b)) {
    ZERO_THROW(InvalidArgument,
               "stage 3: unit {} ({} bytes gathered) does not fit the gather window: "
               "EngineOptions.max_live_gathered_bytes is {} and open scopes hold {}: close scopes earlier or raise "
               "EngineOptions.max_live_gathered_bytes",
               layout_.buckets()[b].unit, unit_bytes(b), cap_, held_units());
  }
  if (!resident(b)) issue(b, use, false);
  Unit& u = units_[b];
  ++u.users;
  u.last_use = ++clock_;
  if (unit_bytes(b) <= config_.persistence_bytes) u.persistent = true;
  // The next units' gathers are issued before this one is waited for, so the communicator runs them
  // back to back instead of idling between this gather's completion and the next issue.
  prefetch();
  finish(b);
  return u.data.data();
}

void* ParamGatherer::gathered(size_t b) {
  ZERO_CHECK(resident(b) && units_[b].users > 0, "unit bucket {} read outside a scope", b);
  return units_[b].data.data();
}

void ParamGatherer::release(size_t b, GatherUse use) {
  Unit& u = units_[b];
  ZERO_CHECK(resident(b) && u.users > 0, "release of unit bucket {} that no scope holds", b);
  --u.users;
  // A forward scope may keep the unit for its backward (reshard_after_forward = false).
  if (use == GatherUse::kForward && !config_.reshard_after_forward) u.persistent = true;
  if (use == GatherUse::kBackward && unit_bytes(b) > config_.persistence_bytes) u.persistent = false;
  // A unit asked for again later in the step stays while the window has room for it (the last
  // block's forward, then its backward; a forward kept for its backward): make_room and prefetch
  // evict such units least recently used first when the room is needed. Any other unit goes now.
  if (u.users == 0 && !u.persistent && !next_entry_is(b) && !needed_later(b)) evict(b);
}

bool ParamGatherer::needed_later(size_t b) const {
  const Follow& f = evaluating_ ? evaluation_ : training_;
  if (!order_agreed_ || f.on_demand) return false;
  const std::vector<int64_t>& order = *f.order;
  for (size_t p = f.position; p < order.size(); ++p) {
    if (static_cast<size_t>(order[p] / 2) == b) return true;
  }
  return false;
}

void ParamGatherer::prefetch() {
  const Follow& f = evaluating_ ? evaluation_ : training_;
  if (!order_agreed_ || f.on_demand) return;
  const std::vector<int64_t>& order = *f.order;
  size_t ahead = 0, ahead_bytes = 0;  // units (a unit of two dtypes is two buckets) and their bytes
  int ahead_unit = -1;
  // The units asked for before the one prefetched stay: evicting one (a kept unit may well be the
  // next one) would trade a gather needed now for one needed later.
  std::vector<size_t> sooner;
  for (size_t p = f.position; p < order.size(); ++p) {
    const size_t b = static_cast<size_t>(order[p] / 2);
    if (std::find(sooner.begin(), sooner.end(), b) != sooner.end()) continue;
    if (layout_.buckets()[b].unit != ahead_unit) ++ahead;
    ahead_unit = layout_.buckets()[b].unit;
    ahead_bytes += unit_bytes(b);
    if (config_.prefetch_bytes == 0 ? ahead > 1 : ahead_bytes > config_.prefetch_bytes) break;
    sooner.push_back(b);
    if (resident(b)) continue;
    if (!make_prefetch_room(unit_bytes(b), sooner)) break;
    fault::point("prefetch");
    issue(b, evaluating_ ? GatherUse::kEvaluation : order[p] % 2 != 0 ? GatherUse::kBackward : GatherUse::kForward,
          true);
  }
}

void ParamGatherer::begin_evaluation() {
  ZERO_CHECK(!evaluating_, "evaluation inside an evaluation");
  evaluating_ = true;
  evaluation_.position = 0;
  evaluation_.on_demand = false;
  prefetch();
}

void ParamGatherer::end_evaluation() {
  ZERO_CHECK(evaluating_, "end of an evaluation that did not begin");
  for (size_t b = 0; b < units_.size(); ++b) {
    ZERO_CHECK_EQ(units_[b].users, 0, "an evaluation ended with a gather scope of unit bucket {} open", b);
  }
  evaluating_ = false;
  // What the evaluation left in the window goes, except what training needs next.
  for (size_t b = 0; b < units_.size(); ++b) {
    if (resident(b) && !units_[b].persistent && !next_entry_is(b)) evict(b);
  }
  prefetch();
}

bool ParamGatherer::same_order_everywhere() {
  uint64_t h = 1469598103934665603ull ^ current_.size();  // FNV-1a over the entries
  for (int64_t e : current_) h = (h ^ static_cast<uint64_t>(e)) * 1099511628211ull;
  const size_t world = static_cast<size_t>(comm_.size()), slots = check_slots();
  int64_t* host = hash_host_.as<int64_t>();
  host[0] = static_cast<int64_t>(h);
  memory::Stream& compute = device_.compute_stream();
  device_.copy(hash_send_.data(), host, sizeof(int64_t), compute);
  order_.before_issue(compute);
  comm::WorkHandle w;
  {
    comm::CallLabel label(comm_, "stage 3 unit order");
    w = comm_.all_gather(hash_send_.data(), hash_recv_.data(), slots, DType::kInt64);
  }
  order_.after(*w, compute);
  device_.copy(host + 1, hash_recv_.data(), world * slots * sizeof(int64_t), compute);
  // The next step's non-finite counts start at 0 (its quantizers run after this on the compute
  // stream, or on the offload copy stream after an event the compute stream records later).
  if (slots > 1) device_.fill_zero(hash_send_.as<int64_t>() + 1, (slots - 1) * sizeof(int64_t), compute);
  device_.synchronize(compute, config_.timeout);
  const int64_t* all = host + 1;
  // Every rank sees every count: a non-finite parameter stops every rank with the same error.
  std::string held;
  for (size_t r = 0; r < world; ++r) {
    for (size_t b = 0; b + 1 < slots; ++b) {
      const int64_t n = all[r * slots + 1 + b];
      if (n > 0) held += fmt::format("{}rank {} unit {} ({} values)", held.empty() ? "" : ", ", r, layout_.buckets()[b].unit, n);
    }
  }
  if (!held.empty()) {
    ZERO_THROW(Error,
               "stage 3, quantized gathers (EngineOptions.quantized_weights): non-finite parameters this step: {}; "
               "they came back as NaN in their own elements. The parameters were non-finite before the gather (an "
               "update or a load made them so)",
               held);
  }
  for (size_t r = 0; r < world; ++r) {
    if (all[r * slots] != host[0]) return false;
  }
  return true;
}

void ParamGatherer::invalidate() {
  for (size_t b = 0; b < units_.size(); ++b) {
    ZERO_CHECK_EQ(units_[b].users, 0, "a gather scope is open while the shard is rewritten");
    if (resident(b)) evict(b);
  }
  drop_node_parts();
}

void ParamGatherer::after_step() {
  ZERO_CHECK(!evaluating_, "step() inside an evaluation");
  for (size_t b = 0; b < units_.size(); ++b) finish(b);
  // Every rank checks the order it followed against the others' (a mismatch that no all-gather
  // revealed, e.g. a unit served from the window on one rank and gathered on another): one small
  // all-gather of a hash each step; only when the hashes differ (on every rank alike) are the
  // orders exchanged in full, for the error that names the first difference.
  if (!same_order_everywhere()) {
    std::vector<AgreementEntry> entries;
    for (size_t i = 0; i < current_.size(); ++i) {
      entries.push_back({fmt::format("position {}", i), entry_label(current_[i])});
    }
    check_agreement(comm_, {.what = "stage 3 unit order", .verb = "has"}, entries, "", config_.timeout, &device_);
  }
  if (order_agreed_ && current_ != recorded_) ZERO_LOG_INFO("stage 3: the unit order changed; recorded the new one");
  recorded_ = std::move(current_);
  current_.clear();
  recorded_forward_.clear();
  for (int64_t e : recorded_) {
    if (e % 2 == 0) recorded_forward_.push_back(e);
  }
  order_agreed_ = true;
  training_.position = 0;
  training_.on_demand = false;
  // The update changed every shard: every gathered copy is stale.
  for (size_t b = 0; b < units_.size(); ++b) {
    ZERO_CHECK_EQ(units_[b].users, 0, "a gather scope is still open at step()");
    if (resident(b)) evict(b);
  }
  drop_node_parts();
  // Nothing is gathered now: the window's slab grows here if this step's placements outgrew it.
  window_.settle();
  prefetch();  // the next step's first unit, while the loop prepares its data
}

}  // namespace zero
