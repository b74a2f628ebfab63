#include "zero/param_gatherer.h"

#include <algorithm>
#include <string>

#include "base/fault_injection.h"
#include "base/check.h"
#include "base/logging.h"
#include "zero/rank_agreement.h"

namespace zero {
ParamGatherer::ParamGatherer(const GathererConfig& config, const ShardLayout& layout,
                             const ShardOwnership& ownership, comm::Communicator& shard_comm,
                             memory::Device& device, const std::vector<const void*>& initial)
    : config_(config), layout_(layout), comm_(shard_comm), device_(device), order_(device, shard_comm, config.timeout) {
  const DType dt = config_.model_dtype;
  const size_t es = dtype_size(dt);
  memory::Stream& compute = device_.compute_stream();
  const size_t shard_bytes = ownership.numel() * es;
  if (config_.offload_tracker != nullptr) {
    shard_ = device_.allocate_host_staging(shard_bytes, memory::Category::kParams, *config_.offload_tracker);
    h2d_ = device_.create_stream("parameter offload h2d");
    slot_free_ = device_.create_event();
  } else {
    shard_ = device_.allocate(shard_bytes, memory::Category::kParams);
  }
  for (const OwnedPiece& p : ownership.pieces()) {
    device_.copy(static_cast<char*>(shard_.data()) + p.opt_offset * es,
                 static_cast<const char*>(initial[p.tensor]) + p.tensor_begin * es, (p.tensor_end - p.tensor_begin) * es,
                 compute);
  }
  slot_elems_ = layout_.max_bucket_padded();
  const size_t slot_bytes = slot_elems_ * es;
  const size_t cap = config_.max_live_bytes ? config_.max_live_bytes : 2 * slot_bytes;
  if (cap < slot_bytes) {
    ZERO_THROW(InvalidArgument,
               "EngineOptions.max_live_gathered_bytes = {} cannot hold the largest unit ({} bytes gathered)", cap,
               slot_bytes);
  }
  slots_.resize(cap / slot_bytes);
  window_ = device_.allocate(slots_.size() * slot_bytes, memory::Category::kGatherWindow);
  const size_t world = static_cast<size_t>(comm_.size());
  hash_send_ = device_.allocate_elements(1, DType::kInt64, memory::Category::kCommBuffer);
  hash_recv_ = device_.allocate_elements(static_cast<int64_t>(world), DType::kInt64, memory::Category::kCommBuffer);
  hash_host_ = device_.allocate_host_staging((world + 1) * sizeof(int64_t), memory::Category::kCommBuffer);
}

ParamGatherer::~ParamGatherer() {
  // Copies and all-gathers still in flight write into the window: let them finish (or fail) first.
  try {
    if (h2d_) device_.synchronize(*h2d_, config_.timeout);
  } catch (const std::exception& e) {
    ZERO_LOG_WARN("engine destroyed with a failed parameter copy in flight: {}", e.what());
  }
  for (Slot& s : slots_) {
    try {
      if (s.data_work) s.data_work->wait(config_.timeout);
    } catch (const std::exception& e) {
      ZERO_LOG_WARN("engine destroyed with a failed parameter all-gather in flight: {}", e.what());
    }
  }
}

size_t ParamGatherer::unit_bytes(size_t b) const { return layout_.buckets()[b].padded * dtype_size(config_.model_dtype); }

int ParamGatherer::find(size_t b) const {
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& x = slots_[s];
    if (x.bucket == static_cast<int>(b) && (x.valid || x.data_work)) return static_cast<int>(s);
  }
  return -1;
}

// An empty or stale slot first, else the least recently used one that no scope holds, that is not
// being gathered, not kept for later and not holding a unit of `sooner`; -1 when there is none.
int ParamGatherer::free_slot(const std::vector<int>& sooner) {
  int best = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& x = slots_[s];
    if (x.bucket < 0 || (!x.valid && !x.data_work)) return static_cast<int>(s);
    if (x.users > 0 || x.data_work || x.persistent) continue;
    if (std::find(sooner.begin(), sooner.end(), x.bucket) != sooner.end()) continue;
    if (best < 0 || x.last_use < slots_[static_cast<size_t>(best)].last_use) best = static_cast<int>(s);
  }
  return best;
}

void ParamGatherer::issue(size_t b, bool backward, int s) {
  Slot& x = slots_[static_cast<size_t>(s)];
  const auto& B = layout_.buckets()[b];
  const size_t es = dtype_size(config_.model_dtype);
  x = Slot{};
  x.bucket = static_cast<int>(b);
  x.backward = backward;
  char* slot = static_cast<char*>(window_.data()) + static_cast<size_t>(s) * slot_elems_ * es;
  const char* send = static_cast<const char*>(shard_.data()) + B.shard_offset * es;
  if (h2d_) {
    // Parameter offload: the chunk comes over into its own place in the slot (in place all-gather)
    // once the compute stream is done with the slot's previous unit and with the update that wrote
    // the shard.
    char* own = slot + static_cast<size_t>(comm_.rank()) * B.chunk * es;
    device_.record(*slot_free_, device_.compute_stream());
    device_.wait(*h2d_, *slot_free_);
    device_.copy(own, send, B.chunk * es, *h2d_);
    order_.before_issue(*h2d_);
    send = own;
  } else {
    // The shard was last written by the update on the compute stream.
    order_.before_issue(device_.compute_stream());
  }
  // The unit travels in the schedule check's record: ranks that gather different units here (even
  // units of the same size) fail with the communicator's mismatch error, which names each rank's
  // unit, before any data is used.
  comm::CallLabel label(comm_, unit_label(b, backward));
  x.data_work = comm_.all_gather(send, slot, B.chunk, config_.model_dtype);
  if (config_.timings) config_.timings->gathered_bytes += B.padded * es;
}

void ParamGatherer::finish(int s) {
  Slot& x = slots_[static_cast<size_t>(s)];
  if (!x.data_work) return;
  ScopedTimer waiting(config_.timings ? &config_.timings->gather_wait_s : nullptr);
  try {
    order_.after(*x.data_work, device_.compute_stream());
  } catch (const Error& e) {
    const std::string what = fmt::format("stage 3: the all-gather of {} failed: {}", unit_label(static_cast<size_t>(x.bucket), x.backward), e.what());
    x.data_work.reset();
    x.bucket = -1;
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(what);
    throw CommError(what);
  }
  x.data_work.reset();
  x.valid = true;
}

std::string ParamGatherer::unit_label(size_t b, bool backward) const {
  return fmt::format("unit {} {}", layout_.buckets()[b].unit, backward ? "backward" : "forward");
}

void* ParamGatherer::acquire(size_t b, bool backward) {
  const int64_t entry = static_cast<int64_t>(b) * 2 + (backward ? 1 : 0);
  current_.push_back(entry);
  if (order_agreed_ && !on_demand_) {
    if (position_ < recorded_.size() && recorded_[position_] == entry) {
      ++position_;
    } else {
      on_demand_ = true;
      ZERO_LOG_INFO("stage 3: {} asked for at position {} of the step, where the recorded order has {}: the rest "
                    "of this step gathers on demand, and the new order is recorded",
                    entry_label(entry), position_,
                    position_ < recorded_.size() ? entry_label(recorded_[position_]) : "the end of the step");
    }
  }
  int s = find(b);
  if (s < 0) {
    s = free_slot();
    if (s < 0) {
      ZERO_THROW(InvalidArgument,
                 "stage 3: the gather window is full ({} slot(s) of {} bytes, all held by open scopes or kept for "
                 "backward) when unit {} is asked for: close scopes earlier or raise "
                 "EngineOptions.max_live_gathered_bytes",
                 slots_.size(), slot_elems_ * dtype_size(config_.model_dtype), layout_.buckets()[b].unit);
    }
    issue(b, backward, s);
  }
  Slot& x = slots_[static_cast<size_t>(s)];
  ++x.users;
  x.last_use = ++clock_;
  if (unit_bytes(b) <= config_.persistence_bytes) x.persistent = true;
  // The next units' gathers are issued before this one is waited for, so the communicator runs them
  // back to back instead of idling between this gather's completion and the next issue.
  if (order_agreed_ && !on_demand_) prefetch_from(position_);
  finish(s);
  return static_cast<char*>(window_.data()) + static_cast<size_t>(s) * slot_elems_ * dtype_size(config_.model_dtype);
}

void ParamGatherer::release(size_t b, bool backward) {
  const int s = find(b);
  ZERO_CHECK(s >= 0, "release of unit bucket {} that is not gathered", b);
  Slot& x = slots_[static_cast<size_t>(s)];
  ZERO_CHECK_GT(x.users, 0);
  --x.users;
  // A forward scope may keep the unit for its backward (reshard_after_forward = false).
  const bool keep = !backward && !config_.reshard_after_forward;
  x.persistent = x.persistent || keep;
  if (backward && unit_bytes(b) > config_.persistence_bytes) x.persistent = false;
}

void ParamGatherer::prefetch_from(size_t position) {
  // Default budget: the largest unit, i.e. one unit ahead.
  const size_t budget = config_.prefetch_bytes ? config_.prefetch_bytes : slot_elems_ * dtype_size(config_.model_dtype);
  size_t ahead = 0;
  // The units asked for before the one prefetched stay: evicting one (the least recently used may
  // well be the next unit, still resident from its forward) would trade a gather needed now for
  // one needed later, and with every other slot held leave the next acquire no slot at all.
  std::vector<int> sooner;
  for (size_t p = position; p < recorded_.size(); ++p) {
    const size_t b = static_cast<size_t>(recorded_[p] / 2);
    ahead += unit_bytes(b);
    if (ahead > budget) break;
    const bool resident = find(b) >= 0;
    sooner.push_back(static_cast<int>(b));
    if (resident) continue;
    const int s = free_slot(sooner);
    if (s >= 0) fault::point("prefetch");
    if (s < 0) break;
    issue(b, recorded_[p] % 2 != 0, s);
  }
}

bool ParamGatherer::same_order_everywhere() {
  uint64_t h = 1469598103934665603ull ^ current_.size();  // FNV-1a over the entries
  for (int64_t e : current_) h = (h ^ static_cast<uint64_t>(e)) * 1099511628211ull;
  const size_t world = static_cast<size_t>(comm_.size());
  int64_t* host = hash_host_.as<int64_t>();
  host[0] = static_cast<int64_t>(h);
  memory::Stream& compute = device_.compute_stream();
  device_.copy(hash_send_.data(), host, sizeof(int64_t), compute);
  order_.before_issue(compute);
  comm::WorkHandle w;
  {
    comm::CallLabel label(comm_, "stage 3 unit order");
    w = comm_.all_gather(hash_send_.data(), hash_recv_.data(), 1, DType::kInt64);
  }
  order_.after(*w, compute);
  device_.copy(host + 1, hash_recv_.data(), world * sizeof(int64_t), compute);
  device_.synchronize(compute, config_.timeout);
  return std::all_of(host + 1, host + 1 + world, [&](int64_t x) { return x == host[0]; });
}

void ParamGatherer::invalidate() {
  for (size_t s = 0; s < slots_.size(); ++s) {
    finish(static_cast<int>(s));
    ZERO_CHECK_EQ(slots_[s].users, 0, "a gather scope is open while the shard is rewritten");
    slots_[s].valid = false;
  }
}

void ParamGatherer::after_step() {
  for (size_t s = 0; s < slots_.size(); ++s) finish(static_cast<int>(s));
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
  recorded_ = current_;
  order_agreed_ = true;
  current_.clear();
  position_ = 0;
  on_demand_ = false;
  for (Slot& x : slots_) {
    ZERO_CHECK_EQ(x.users, 0, "a gather scope is still open at step()");
    x.valid = false;  // the update changed every shard
    x.persistent = false;
  }
  prefetch_from(0);  // the next step's first unit, while the loop prepares its data
}

}  // namespace zero
