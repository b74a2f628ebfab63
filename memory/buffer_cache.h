#pragma once
// BufferCache: buffers of exact sizes, reused in stream order, never holding more than the peak of
// what its users held at once.
//
// The engine's transient buffers (the stage 3 gather window, the gradient reduction staging) come
// in a few sizes that repeat every step: each unit's size, each bucket's. A pool of slots of the
// largest size wastes the difference on every smaller unit (a 50k-token embedding next to
// transformer blocks, a LayerNorm next to both), and a fresh allocation per use costs a cudaMalloc
// (which synchronizes) or page faults on the host. The cache hands out a buffer of exactly the size
// asked for, keeps given-back buffers for the next request of the same size, and frees cached ones
// (least recently given first) whenever keeping them would take the total above the peak of bytes
// live at once. So the device memory it holds, as the tracker reports it, is what its users needed
// at their peak, and in a repeating pattern nothing is allocated after the first round.
//
// Stream order, as CUDA's stream-ordered allocator: give() records where its last user's work
// ends; take() makes the new user's stream wait for it, so reuse never blocks the host.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "memory/device.h"

namespace zero::memory {

class BufferCache {
 public:
  BufferCache(Device& device, Category category);
  ~BufferCache();
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // A buffer of exactly `bytes` (> 0): a cached one of that size (its earlier work ordered before
  // `stream`'s later work; contents unspecified) or a new, zero-filled one.
  Buffer take(size_t bytes, Stream& stream);
  // `buffer` (from take()) is free once `stream`'s work issued so far completes.
  void give(Buffer buffer, Stream& stream);
  // Frees every cached buffer (after its last work).
  void clear();

  size_t live_bytes() const { return live_; }            // taken and not given back
  size_t peak_live_bytes() const { return peak_live_; }  // the most live at once so far
  size_t cached_bytes() const { return cached_; }
  size_t allocations() const { return allocations_; }    // buffers allocated so far (not reused)

 private:
  struct Cached {
    Buffer buffer;
    std::unique_ptr<Event> free;  // the last user's work ends here
    uint64_t given = 0;           // when it was given back (for least recently given first)
  };
  void drop(size_t i);  // frees cached_[i] once its work completed

  Device& device_;
  Category category_;
  std::vector<Cached> entries_;
  std::vector<std::unique_ptr<Event>> spare_events_;  // events are reused, not created per give()
  size_t live_ = 0, peak_live_ = 0, cached_ = 0, allocations_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace zero::memory
