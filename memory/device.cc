#include "memory/device.h"

#include "memory/buffer.h"

namespace zero::memory {

Buffer Device::allocate_elements(int64_t count, DType dtype, Category category) {
  return allocate(checked_bytes(count, dtype, category), category);
}

Buffer Device::allocate_host_staging(size_t bytes, Category category) {
  return allocate_host_staging(bytes, category, tracker());
}

Buffer Device::allocate_host_staging(size_t bytes, Category category, MemoryTracker& tracker) {
  return allocate_pinned(bytes, category, tracker);
}

}  // namespace zero::memory
