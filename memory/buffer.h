#pragma once
// Owning, move-only memory buffers. Each reports its bytes to a MemoryTracker (the one it is given,
// else MemoryTracker::global()) under the category it was created with, and releases them to that
// same tracker on destruction. The tracker must outlive the buffer.
//
// Sizes are checked before anything is allocated: a negative element count, a byte size that
// overflows, or an allocation the system refuses throws zero::AllocationError naming the size and the
// category (never a crash or a null buffer).
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/dtype.h"
#include "memory/tracker.h"

namespace zero::memory {

// Bytes for `count` elements of `dtype`; throws AllocationError (naming the category) if count is
// negative or the product overflows.
size_t checked_bytes(int64_t count, DType dtype, Category category);

// Host memory aligned to 64 bytes (a cache line and one AVX-512 vector), zero-filled.
class HostBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  HostBuffer() = default;
  HostBuffer(size_t bytes, Category category, MemoryTracker& tracker = MemoryTracker::global());
  static HostBuffer for_elements(int64_t count, DType dtype, Category category,
                                 MemoryTracker& tracker = MemoryTracker::global());
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size_bytes() const { return bytes_; }
  Category category() const { return category_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  template <typename T>
  std::span<T> span() { return {as<T>(), bytes_ / sizeof(T)}; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Category category_ = Category::kOther;
  MemoryTracker* tracker_ = nullptr;  // set while data_ is
};

// Page-locked host memory for fast, asynchronous device transfers and the offload tier.
// With a CUDA device present at run time (CUDA builds) it comes from cudaHostAlloc; otherwise the
// pages are mlock'd where RLIMIT_MEMLOCK allows, else it is ordinary pageable memory and one warning
// is logged for the process. kind() tells which.
class PinnedBuffer {
 public:
  enum class Kind { kCudaHost, kLocked, kPageable };

  PinnedBuffer() = default;
  PinnedBuffer(size_t bytes, Category category, MemoryTracker& tracker = MemoryTracker::global());
  static PinnedBuffer for_elements(int64_t count, DType dtype, Category category,
                                   MemoryTracker& tracker = MemoryTracker::global());
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size_bytes() const { return bytes_; }
  Category category() const { return category_; }
  Kind kind() const { return kind_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Category category_ = Category::kOther;
  Kind kind_ = Kind::kPageable;
  MemoryTracker* tracker_ = nullptr;  // set while data_ is
};

const char* pinned_kind_name(PinnedBuffer::Kind kind);

// True when the CUDA runtime reports at least one device (always false in CPU builds).
bool cuda_device_available();

}  // namespace zero::memory
