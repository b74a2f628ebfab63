#include "memory/device_buffer.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "base/check.h"
#include "memory/tracked_allocation.h"

namespace zero::memory {
namespace {

// cudaFree finds the owning device through unified addressing; it synchronizes that device. An
// error (e.g. the runtime already unloading at exit) leaves nothing to undo.
void free_cuda(void* data, size_t) {
  if (cudaFree(data) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace

Buffer allocate_cuda(size_t bytes, Category category, int device, MemoryTracker& tracker) {
  if (bytes == 0) return Buffer(nullptr, Location::cuda(device), category);
  // Not DeviceGuard: every failure here must become one AllocationError with the full context.
  int previous = -1;
  cudaError_t error = cudaGetDevice(&previous);
  if (error == cudaSuccess && previous != device) error = cudaSetDevice(device);
  void* raw = nullptr;
  if (error == cudaSuccess) error = cudaMalloc(&raw, bytes);
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so later launch checks do not see it
    ZERO_THROW(AllocationError, "cannot allocate {} bytes ({}) on {} for {}: {} ({})", bytes,
               format_bytes(bytes), Location::cuda(device).name(), category_name(category),
               cudaGetErrorString(error), cudaGetErrorName(error));
  }
  return make_tracked_buffer(raw, bytes, free_cuda, category, Location::cuda(device), tracker, "CUDA device");
}

Buffer allocate_cuda_elements(int64_t count, DType dtype, Category category, int device, MemoryTracker& tracker) {
  return allocate_cuda(checked_bytes(count, dtype, category), category, device, tracker);
}

}  // namespace zero::memory
