#pragma once
// BufferCache: buffers of exact sizes carved from one slab at planned offsets, in stream order; after
// the first steps of a repeating pattern nothing is allocated, freed or waited for.
//
// The engine's transient buffers (the stage 3 gather window, the gradient reduction staging) come
// in a few sizes that repeat every step: each unit's size, each bucket's. A pool of slots of the
// largest size wastes the difference on every smaller unit (a 50k-token embedding next to
// transformer blocks, a LayerNorm next to both); separate buffers of exact sizes, kept within the
// live peak, must be freed and allocated again whenever units of different sizes take turns (each
// free a host wait for the buffer's last work, and on a GPU a cudaFree, which synchronizes the
// device); keeping every size instead costs a third more memory at GPT-2 124M.
//
// So the cache sub-allocates one slab, as PyTorch's caching allocator splits its blocks, and plans
// where each request goes, as a compiler plans a step's temporaries:
//
//   offsets  0          capacity                      high-water
//            |---slab----|---beyond: own buffers--------|
//
// Every take and give of a step is traced (sizes, and which take each give returns). A step that
// repeats the planned trace gets each take at its planned offset, inside the slab: nothing is
// allocated, freed or waited for. A step that departs from it places the rest first fit in offset
// order (or past everything used so far); a range past the slab gets a buffer of its own, freed when
// given back after its last work (a host wait). At settle(), which the cache's user calls where it
// holds nothing (the step's end), a step that did not follow the plan is planned: largest request
// first, each at the lowest offset clear of the ranges live at the same time, which packs a step
// near its live peak; the slab grows to the plan. So the first step, and one that changes (stage 3's
// second, when prefetch starts), costs allocations; every step after that repeats the plan. What it
// holds is the plan's extent, which the planner (this same code on the meta device) predicts exactly.
//
// Stream order, as CUDA's stream-ordered allocator: give() records where its last user's work ends
// on its stream; take() makes the new user's stream wait for the work of every stream that last used
// the range (none for its own stream, whose order already holds), so reuse never blocks the host.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "memory/device.h"

namespace zero::memory {

class BufferCache {
 public:
  BufferCache(Device& device, Category category);
  ~BufferCache();
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // A buffer of exactly `bytes` (> 0), ordered after the earlier users of its memory for `stream`'s
  // later work; contents unspecified. It must come back through give() (destroying it does not
  // return its range).
  Buffer take(size_t bytes, Stream& stream);
  // `buffer` (from take()) is free once `stream`'s work issued so far completes.
  void give(Buffer buffer, Stream& stream);
  // A point where the user holds no buffer (else it does nothing): a step that did not follow the
  // plan is planned, and the slab grows to the plan (after every range's last work) within the limit.
  void settle();
  // Frees the slab (after every range's last work); live buffers must have been given back.
  void clear();
  // A bound on the slab (a user's memory limit): take() still places past it, on memory of its own,
  // but the slab never grows past it. fits() says whether first fit would place a request within
  // it, so that the user can free ranges first.
  void limit_to(size_t max_bytes) { limit_ = max_bytes; }
  bool fits(size_t bytes) const;
  // What a request of `bytes` occupies in the slab (ranges start on 64-byte boundaries).
  static size_t placed_bytes(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  // Allocates the slab at `bytes` now (within the limit), for a user that knows what it will need
  // (the stage 3 window: its limit, or every unit when they all fit); nothing may be out.
  void reserve(size_t bytes);

  size_t live_bytes() const { return live_; }            // taken and not given back (as requested)
  size_t peak_live_bytes() const { return peak_live_; }  // the most live at once so far
  size_t capacity_bytes() const { return capacity_; }    // the slab
  size_t allocations() const { return allocations_; }    // device allocations so far (slabs and beyond)

 private:
  static constexpr size_t kAlign = 64;  // a cache line; vectorized kernels on either device
  // The last use of a range by one stream (the latest recorded on that stream covers earlier ones).
  struct Use {
    Stream* stream = nullptr;
    std::shared_ptr<Event> done;
    uint64_t seq = 0;
  };
  struct FreeRange {
    size_t size = 0;
    std::vector<Use> uses;
  };
  struct Taken {
    size_t offset = 0, size = 0, requested = 0;
    size_t index = 0;  // the step's take number
    Buffer own;        // a range past the slab: its own memory
  };
  static void merge_uses(std::vector<Use>& into, const std::vector<Use>& from);
  // Where first fit places `size` (aligned) bytes: the first free range that holds them, else the
  // free range that ends at the high-water (extended), else the high-water.
  size_t place(size_t size) const;
  std::shared_ptr<Event> record(Stream& stream);
  // Removes [offset, offset + size) from the free ranges (or the space past the high-water): the
  // uses the new user must follow.
  std::vector<Use> carve(size_t offset, size_t size);
  // Adds [offset, offset + size) to the free ranges, merged with its free neighbours.
  void release(size_t offset, size_t size, std::vector<Use> uses);
  // Appends a take (its placed size) or a give (-(take number + 1)) to the step's trace, and notes
  // whether the step still follows the plan's.
  void trace(int64_t token);
  // Offsets for a step's trace, largest first at the lowest offset clear of the ranges live at the
  // same time; `needed` is the slab they take.
  static std::vector<size_t> plan(const std::vector<int64_t>& trace, size_t* needed);
  void wait_all(const std::vector<Use>& uses);  // blocks until every use completed

  Device& device_;
  Category category_;
  std::vector<std::unique_ptr<Event>> spare_events_;  // before the maps: their events return here
  Buffer slab_;
  size_t capacity_ = 0;
  std::map<size_t, FreeRange> free_;  // offset -> free range, below high_water_
  size_t high_water_ = 0;             // offsets at and past it were never used since the last reset
  size_t limit_ = std::numeric_limits<size_t>::max();
  std::unordered_map<const void*, Taken> taken_;
  std::vector<int64_t> trace_, plan_trace_;  // this step's takes and gives; the planned step's
  std::vector<size_t> plan_offsets_;         // per take of the planned step
  size_t takes_ = 0;                         // takes this step
  bool following_ = false;                   // this step has followed the plan so far
  size_t live_ = 0, peak_live_ = 0, allocations_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace zero::memory
