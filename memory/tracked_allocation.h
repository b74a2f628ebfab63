#pragma once
// Internal to memory/: the Allocation behind every buffer the library allocates itself (host,
// pinned host, CUDA). It owns the memory and its accounting; destroyed, it frees the memory the way
// it was obtained and returns the bytes to the tracker. Buffer does the moving, this the rest, once
// for every kind of memory.
#include <cstddef>
#include <memory>

#include "memory/buffer.h"
#include "memory/tracker.h"

namespace zero::memory {

// How one kind of memory is given back (std::free, munlock + free, cudaFreeHost, cudaFree).
using FreeFn = void (*)(void* data, size_t bytes);

// A Buffer owning `data` (`bytes` bytes from the allocator that `free` undoes), recorded in `tracker`
// at `location`. If the tracker cannot record it, `data` is freed and AllocationError names `what`,
// the size and the category; the tracker is left unchanged.
Buffer make_tracked_buffer(void* data, size_t bytes, FreeFn free, Category category, Location location,
                           MemoryTracker& tracker, const char* what);

}  // namespace zero::memory
