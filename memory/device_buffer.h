#pragma once
// Owning, move-only CUDA device memory (cudaMalloc on a given device). CUDA builds only.
//
// Reports its bytes to the given MemoryTracker (default MemoryTracker::global(); it must outlive the
// buffer) under Location::cuda(ordinal). Contents are not
// initialized. A failed allocation throws zero::AllocationError naming the size, the category, the
// device and the CUDA error.
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "memory/tracker.h"

namespace zero::memory {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, Category category, int device,
               MemoryTracker& tracker = MemoryTracker::global());
  static DeviceBuffer for_elements(int64_t count, DType dtype, Category category, int device,
                                   MemoryTracker& tracker = MemoryTracker::global());
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size_bytes() const { return bytes_; }
  Category category() const { return category_; }
  int device() const { return device_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Category category_ = Category::kOther;
  int device_ = 0;
  MemoryTracker* tracker_ = nullptr;  // set while data_ is
};

}  // namespace zero::memory
