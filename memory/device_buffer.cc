#include "memory/device_buffer.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <utility>

#include "base/check.h"
#include "memory/buffer.h"

namespace zero::memory {

DeviceBuffer::DeviceBuffer(size_t bytes, Category category, int device, MemoryTracker& tracker)
    : category_(category), device_(device) {
  if (bytes == 0) return;
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
  try {
    tracker.on_alloc(category, Location::cuda(device), bytes);
  } catch (...) {
    (void)cudaFree(raw);
    throw;
  }
  data_ = raw;
  bytes_ = bytes;
  tracker_ = &tracker;
}

DeviceBuffer DeviceBuffer::for_elements(int64_t count, DType dtype, Category category, int device,
                                        MemoryTracker& tracker) {
  return DeviceBuffer(checked_bytes(count, dtype, category), category, device, tracker);
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      device_(other.device_),
      tracker_(std::exchange(other.tracker_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    device_ = other.device_;
    tracker_ = std::exchange(other.tracker_, nullptr);
  }
  return *this;
}

void DeviceBuffer::release() {
  if (data_ == nullptr) return;
  // cudaFree finds the owning device through unified addressing; it synchronizes that device. An
  // error (e.g. the runtime already unloading at exit) leaves nothing to undo.
  if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();
  tracker_->on_free(category_, Location::cuda(device_), bytes_);
  data_ = nullptr;
  bytes_ = 0;
  tracker_ = nullptr;
}

}  // namespace zero::memory
