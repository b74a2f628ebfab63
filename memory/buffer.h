#pragma once
// Buffer: the library's one owning type of memory. Move-only; when destroyed it frees its bytes and
// returns them to the MemoryTracker that counted them (the tracker must outlive it).
//
// Where the bytes come from and how they go back is the buffer's Allocation, so one type serves every
// kind of memory: the allocators below (aligned host memory, page-locked host memory, and CUDA
// device memory in memory/device_buffer.h), the Devices of memory/device.h, which hand out these same
// buffers, and the planning device's unbacked address space (memory/meta_device.h).
//
// Sizes are checked before anything is allocated: a negative element count, a byte size that
// overflows, or an allocation the system refuses throws zero::AllocationError naming the size and the
// category (never a crash or a null buffer). A zero-byte request gives an empty buffer that holds and
// tracks nothing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/dtype.h"
#include "memory/tracker.h"

namespace zero::memory {

class Buffer {
 public:
  // What an allocator hands over: the memory, and (in its destructor) how to free and untrack it.
  class Allocation {
   public:
    virtual ~Allocation() = default;
    virtual void* data() = 0;
    virtual size_t size_bytes() const = 0;
  };

  Buffer() = default;
  // A null `allocation` gives an empty buffer (zero bytes) at that location and category.
  Buffer(std::unique_ptr<Allocation> allocation, Location location, Category category);
  // Moves leave the source empty (not defaulted: data_ and bytes_ must not survive in it).
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size_bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  // Where the bytes are accounted: host, pinned_host (page-locked) or cuda:N.
  Location location() const { return location_; }
  DeviceKind kind() const { return location_.kind; }
  Category category() const { return category_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  template <typename T>
  std::span<T> span() { return {as<T>(), bytes_ / sizeof(T)}; }

 private:
  std::unique_ptr<Allocation> allocation_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Location location_ = Location::host();
  Category category_ = Category::kOther;
};

// Bytes for `count` elements of `dtype`; throws AllocationError (naming the category) if count is
// negative or the product overflows.
size_t checked_bytes(int64_t count, DType dtype, Category category);

// Host memory aligned to 64 bytes (a cache line and one AVX-512 vector), zero-filled, accounted at
// Location::host().
inline constexpr size_t kHostAlignment = 64;
Buffer allocate_host(size_t bytes, Category category, MemoryTracker& tracker = MemoryTracker::global());
Buffer allocate_host_elements(int64_t count, DType dtype, Category category,
                              MemoryTracker& tracker = MemoryTracker::global());

// Page-locked host memory for fast, asynchronous device transfers and the offload tier, zero-filled.
// With a CUDA device present at run time (CUDA builds) it comes from cudaHostAlloc; otherwise whole
// pages are mlock'd where RLIMIT_MEMLOCK allows, else it is ordinary pageable memory and one warning
// is logged for the process. Pinned memory is accounted at Location::pinned_host(), the pageable
// fallback at Location::host(); `how`, when given, says which of the three it got.
enum class PinnedKind { kCudaHost, kLocked, kPageable };
const char* pinned_kind_name(PinnedKind kind);
Buffer allocate_pinned(size_t bytes, Category category, MemoryTracker& tracker = MemoryTracker::global(),
                       PinnedKind* how = nullptr);
Buffer allocate_pinned_elements(int64_t count, DType dtype, Category category,
                                MemoryTracker& tracker = MemoryTracker::global(), PinnedKind* how = nullptr);

// True when the CUDA runtime reports at least one device (always false in CPU builds).
bool cuda_device_available();

}  // namespace zero::memory
