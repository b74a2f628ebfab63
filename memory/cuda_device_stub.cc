// The CUDA device factories in a CPU build (no --config=cuda): no CUDA device can be made.
#include <memory>

#include "base/check.h"
#include "memory/device.h"

namespace zero::memory {

bool cuda_device_usable() { return false; }

std::unique_ptr<Device> make_cuda_device(int ordinal, MemoryTracker& /*tracker*/,
                                         void* /*compute_stream*/) {
  ZERO_THROW(InvalidArgument,
             "make_cuda_device({}): this library was built without CUDA (rebuild with "
             "--config=cuda)",
             ordinal);
}

}  // namespace zero::memory
