#include "memory/buffer_cache.h"

#include <algorithm>
#include <chrono>

#include "base/check.h"

namespace zero::memory {

namespace {
// Freeing waits for the buffer's last work; that work was issued long before (a step earlier at
// most), so this bound only turns a broken stream into an error instead of a hang.
constexpr std::chrono::minutes kFreeWait{5};
}  // namespace

BufferCache::BufferCache(Device& device, Category category) : device_(device), category_(category) {}

BufferCache::~BufferCache() {
  try {
    clear();
  } catch (...) {
    // A failed stream: the buffers go with the device's error, which its owner reports.
  }
}

Buffer BufferCache::take(size_t bytes, Stream& stream) {
  ZERO_CHECK_GT(bytes, 0u);
  live_ += bytes;
  peak_live_ = std::max(peak_live_, live_);
  // The most recently given buffer of exactly this size: its memory is the likeliest to be warm.
  int best = -1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].buffer.size_bytes() != bytes) continue;
    if (best < 0 || entries_[i].given > entries_[static_cast<size_t>(best)].given) best = static_cast<int>(i);
  }
  if (best >= 0) {
    Cached& c = entries_[static_cast<size_t>(best)];
    device_.wait(stream, *c.free);
    Buffer b = std::move(c.buffer);
    spare_events_.push_back(std::move(c.free));
    cached_ -= bytes;
    entries_.erase(entries_.begin() + best);
    return b;
  }
  // Keep the total within the live peak: free the least recently given until the new one fits.
  while (!entries_.empty() && live_ + cached_ > peak_live_) {
    const auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                         [](const Cached& a, const Cached& b) { return a.given < b.given; });
    drop(static_cast<size_t>(oldest - entries_.begin()));
  }
  ++allocations_;
  return device_.allocate(bytes, category_);
}

void BufferCache::give(Buffer buffer, Stream& stream) {
  if (buffer.empty()) return;
  ZERO_CHECK_GE(live_, buffer.size_bytes());
  live_ -= buffer.size_bytes();
  cached_ += buffer.size_bytes();
  Cached c;
  c.buffer = std::move(buffer);
  if (spare_events_.empty()) {
    c.free = device_.create_event();
  } else {
    c.free = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  device_.record(*c.free, stream);
  c.given = ++clock_;
  entries_.push_back(std::move(c));
}

void BufferCache::drop(size_t i) {
  device_.synchronize(*entries_[i].free, kFreeWait);
  cached_ -= entries_[i].buffer.size_bytes();
  spare_events_.push_back(std::move(entries_[i].free));
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

void BufferCache::clear() {
  while (!entries_.empty()) drop(entries_.size() - 1);
}

}  // namespace zero::memory
