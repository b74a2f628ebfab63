#pragma once
// The planning device (make_meta_device): a memory::Device whose buffers are accounted exactly as a
// real device's, under the same categories and locations, but where large buffers are only address
// space (read-only, never backed: they read as zeros) and no work is done on them. The planner (zero/plan/) builds a
// real engine on it and takes a step, so the memory and traffic it reports come from the engine's
// own code, with every lazy buffer and transient peak, for a model that need not fit in this
// machine's memory (PyTorch's meta tensors serve the same purpose).
//
// Small buffers (at most kAddressableBytes) are real, zeroed host memory and the kernels run on
// them, because the engine reads a few back on the host (hashes of the registration). An operation
// that touches any unbacked byte is skipped; `addressable()` tells which memory is real, for a
// planning communicator. The engine's host-side reads of large staging (the norm's block sums) see
// zeros; a write to unbacked memory faults at once, so a part that computes on the host in the
// planner shows up as a crash in its test, not as a wrong figure.
//
// Streams are inline and events trivially complete; host_task runs at the call.
#include <cstddef>
#include <memory>

#include "memory/device.h"

namespace zero::memory {

inline constexpr size_t kAddressableBytes = size_t{1} << 20;

class MetaDevice : public Device {
 public:
  // False where any byte of [p, p + bytes) is unbacked address space.
  virtual bool addressable(const void* p, size_t bytes) const = 0;
  // Address space for memory the engine does not own (the user's parameters, in the planner):
  // `bytes` of unbacked memory, never accounted, valid for the device's life.
  virtual void* reserve_unbacked(size_t bytes) = 0;
};

// `location`: where allocate()'s bytes are accounted (Location::host() or Location::cuda(0)), so
// that a plan for a GPU reads as the GPU's memory. `tracker` must outlive the device.
std::unique_ptr<MetaDevice> make_meta_device(MemoryTracker& tracker, Location location = Location::host());

}  // namespace zero::memory
