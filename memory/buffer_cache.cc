#include "memory/buffer_cache.h"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "base/check.h"

namespace zero::memory {

namespace {
// Freeing waits for a range's last work; that work was issued long before (a step earlier at most),
// so this bound only turns a broken stream into an error instead of a hang.
constexpr std::chrono::minutes kFreeWait{5};
constexpr size_t kMaxPlannedTakes = size_t{1} << 14;

// A range of the cache's memory, handed out as a Buffer: the cache frees the memory, not the buffer.
class Range final : public Buffer::Allocation {
 public:
  Range(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data() override { return data_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};
}  // namespace

BufferCache::BufferCache(Device& device, Category category) : device_(device), category_(category) {}

BufferCache::~BufferCache() {
  try {
    clear();
  } catch (...) {
    // A failed stream: the memory goes with the device's error, which its owner reports.
  }
}

void BufferCache::merge_uses(std::vector<Use>& into, const std::vector<Use>& from) {
  for (const Use& f : from) {
    bool found = false;
    for (Use& u : into) {
      if (u.stream != f.stream) continue;
      if (f.seq > u.seq) u = f;
      found = true;
    }
    if (!found) into.push_back(f);
  }
}

std::shared_ptr<Event> BufferCache::record(Stream& stream) {
  std::unique_ptr<Event> e;
  if (spare_events_.empty()) {
    e = device_.create_event();
  } else {
    e = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  device_.record(*e, stream);
  return std::shared_ptr<Event>(e.release(), [this](Event* p) { spare_events_.emplace_back(p); });
}

void BufferCache::wait_all(const std::vector<Use>& uses) {
  for (const Use& u : uses) device_.synchronize(*u.done, kFreeWait);
}

size_t BufferCache::place(size_t size) const {
  for (const auto& [offset, range] : free_) {
    if (range.size >= size) return offset;
  }
  if (!free_.empty()) {
    const auto& [offset, range] = *free_.rbegin();
    if (offset + range.size == high_water_) return offset;
  }
  return high_water_;
}

bool BufferCache::fits(size_t bytes) const {
  const size_t size = placed_bytes(bytes);
  return place(size) + size <= limit_;
}

void BufferCache::trace(int64_t token) {
  if (following_ && (trace_.size() >= plan_trace_.size() || plan_trace_[trace_.size()] != token)) following_ = false;
  trace_.push_back(token);
}

std::vector<BufferCache::Use> BufferCache::carve(size_t offset, size_t size) {
  std::vector<Use> uses;
  if (offset >= high_water_) {
    if (offset > high_water_) release(high_water_, offset - high_water_, {});
    high_water_ = offset + size;
    return uses;
  }
  auto it = free_.upper_bound(offset);
  ZERO_CHECK(it != free_.begin(), "offset {} is not free", offset);
  --it;
  const size_t begin = it->first, end = it->first + it->second.size;
  ZERO_CHECK(begin <= offset && offset < end && (offset + size <= end || end == high_water_),
             "[{}, {}) is not free", offset, offset + size);
  uses = std::move(it->second.uses);
  free_.erase(it);
  if (begin < offset) free_.emplace(begin, FreeRange{offset - begin, uses});
  if (offset + size < end) free_.emplace(offset + size, FreeRange{end - offset - size, uses});
  high_water_ = std::max(high_water_, offset + size);
  return uses;
}

Buffer BufferCache::take(size_t bytes, Stream& stream) {
  ZERO_CHECK_GT(bytes, 0u);
  const size_t size = placed_bytes(bytes);
  const size_t index = takes_++;
  trace(static_cast<int64_t>(size));
  // Where the plan put this take while the step follows the traced one; else first fit in offset
  // order (or the free range that ends at the high-water, extended, or past the high-water).
  const size_t offset = following_ ? plan_offsets_[index] : place(size);
  const std::vector<Use> uses = carve(offset, size);
  for (const Use& u : uses) {
    if (u.stream != &stream) device_.wait(stream, *u.done);
  }
  Taken t{.offset = offset, .size = size, .requested = bytes, .index = index};
  void* data;
  if (offset + size <= capacity_) {
    data = slab_.as<char>() + offset;
  } else {
    t.own = device_.allocate(bytes, category_);
    ++allocations_;
    data = t.own.data();
  }
  taken_.emplace(data, std::move(t));
  live_ += bytes;
  peak_live_ = std::max(peak_live_, live_);
  return Buffer(std::make_unique<Range>(data, bytes), device_.location(), category_);
}

void BufferCache::give(Buffer buffer, Stream& stream) {
  if (buffer.empty()) return;
  auto it = taken_.find(buffer.data());
  ZERO_CHECK(it != taken_.end(), "a buffer this cache did not hand out was given back");
  Taken t = std::move(it->second);
  taken_.erase(it);
  trace(-static_cast<int64_t>(t.index) - 1);
  ZERO_CHECK_GE(live_, t.requested);
  live_ -= t.requested;
  Use use{&stream, record(stream), ++seq_};
  if (!t.own.empty()) {
    // A range past the slab has memory of its own: free it once its last work completed.
    device_.synchronize(*use.done, kFreeWait);
    t.own = Buffer();
  }
  release(t.offset, t.size, {use});
}

void BufferCache::release(size_t offset, size_t size, std::vector<Use> uses) {
  auto [range, inserted] = free_.emplace(offset, FreeRange{size, std::move(uses)});
  ZERO_CHECK(inserted, "range at offset {} freed twice", offset);
  auto next = std::next(range);
  if (next != free_.end() && range->first + range->second.size == next->first) {
    range->second.size += next->second.size;
    merge_uses(range->second.uses, next->second.uses);
    free_.erase(next);
  }
  if (range != free_.begin()) {
    auto prev = std::prev(range);
    if (prev->first + prev->second.size == range->first) {
      prev->second.size += range->second.size;
      merge_uses(prev->second.uses, range->second.uses);
      free_.erase(range);
    }
  }
}

void BufferCache::settle() {
  if (!taken_.empty()) return;
  if (!trace_.empty() && !(following_ && trace_.size() == plan_trace_.size())) {
    // The step did not follow the plan: plan its trace, and keep the plan where it fits the limit.
    // Planning is quadratic in the step's takes: a step of more than kMaxPlannedTakes keeps first fit.
    size_t needed = 0;
    std::vector<size_t> offsets;
    if (takes_ <= kMaxPlannedTakes) offsets = plan(trace_, &needed);
    if (!offsets.empty() && needed <= limit_) {
      plan_trace_ = std::move(trace_);
      plan_offsets_ = std::move(offsets);
      reserve(needed);
    } else {
      plan_trace_.clear();
      plan_offsets_.clear();
      reserve(high_water_);
    }
  }
  trace_.clear();
  takes_ = 0;
  following_ = !plan_trace_.empty();
}

std::vector<size_t> BufferCache::plan(const std::vector<int64_t>& trace, size_t* needed) {
  // Each take's size and lifetime (trace positions [start, end)); a range never given back lives to
  // the end.
  struct Item {
    size_t size, start, end;
  };
  std::vector<Item> items;
  for (size_t pos = 0; pos < trace.size(); ++pos) {
    if (trace[pos] > 0) {
      items.push_back({static_cast<size_t>(trace[pos]), pos, trace.size()});
    } else {
      items[static_cast<size_t>(-trace[pos] - 1)].end = pos;
    }
  }
  // Largest first, each at the lowest offset clear of the placed ranges that live at the same time.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].size > items[b].size; });
  std::vector<size_t> offsets(items.size(), 0);
  std::vector<size_t> placed;
  *needed = 0;
  for (size_t i : order) {
    std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of placed ranges live with i
    for (size_t j : placed) {
      if (items[j].start < items[i].end && items[i].start < items[j].end) busy.push_back({offsets[j], offsets[j] + items[j].size});
    }
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (const auto& [b, e] : busy) {
      if (at + items[i].size <= b) break;
      at = std::max(at, e);
    }
    offsets[i] = at;
    *needed = std::max(*needed, at + items[i].size);
    placed.push_back(i);
  }
  return offsets;
}

void BufferCache::reserve(size_t bytes) {
  ZERO_CHECK(taken_.empty(), "reserve() with {} buffer(s) out", taken_.size());
  bytes = std::min(bytes, limit_);
  if (bytes <= capacity_) return;
  for (const auto& [offset, range] : free_) wait_all(range.uses);
  slab_ = Buffer();
  capacity_ = bytes;
  slab_ = device_.allocate(capacity_, category_);
  ++allocations_;
  free_.clear();
  high_water_ = 0;
}

void BufferCache::clear() {
  for (const auto& [offset, range] : free_) wait_all(range.uses);
  free_.clear();
  high_water_ = 0;
  slab_ = Buffer();
  capacity_ = 0;
}

}  // namespace zero::memory
