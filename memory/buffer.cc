#include "memory/buffer.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#include "base/check.h"
#include "base/logging.h"
#include "memory/tracked_allocation.h"

#ifdef ZERO_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace zero::memory {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using MallocPtr = std::unique_ptr<void, FreeDeleter>;

size_t page_size() {
  static const size_t size = [] {
    const long s = sysconf(_SC_PAGESIZE);
    return s > 0 ? static_cast<size_t>(s) : size_t{4096};
  }();
  return size;
}

[[noreturn]] void throw_allocation(size_t bytes, const char* what, Category category,
                                   const std::string& reason) {
  ZERO_THROW(AllocationError, "cannot allocate {} bytes ({}) of {} memory for {}: {}", bytes,
             format_bytes(bytes), what, category_name(category), reason);
}

// `bytes` rounded up to a multiple of `alignment` (a power of two), or an AllocationError.
size_t round_up(size_t bytes, size_t alignment, const char* what, Category category) {
  if (bytes > std::numeric_limits<size_t>::max() - (alignment - 1)) {
    throw_allocation(bytes, what, category,
                     fmt::format("size overflows when rounded up to {} bytes", alignment));
  }
  return (bytes + alignment - 1) & ~(alignment - 1);
}

// Zero-filled memory of `bytes` rounded up to `alignment`, owned by the returned pointer.
MallocPtr aligned_zeroed(size_t bytes, size_t alignment, const char* what, Category category) {
  const size_t rounded = round_up(bytes, alignment, what, category);
  errno = 0;
  MallocPtr p(std::aligned_alloc(alignment, rounded));
  if (!p) {
    throw_allocation(bytes, what, category,
                     errno != 0 ? std::strerror(errno) : "the system refused the allocation");
  }
  std::memset(p.get(), 0, rounded);
  return p;
}

// ---- page locking for pinned memory without CUDA ----

// Bytes this process has locked through allocate_pinned. RLIMIT_MEMLOCK is applied to this count as a
// policy even where the kernel would let a privileged process (CAP_IPC_LOCK) lock more.
std::atomic<uint64_t> g_locked_bytes{0};

// Locks [p, p + bytes) if the limit leaves room; false (and nothing locked) otherwise.
bool try_lock(void* p, size_t bytes, std::string* why) {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    *why = fmt::format("getrlimit(RLIMIT_MEMLOCK) failed: {}", std::strerror(errno));
    return false;
  }
  uint64_t locked = g_locked_bytes.load();
  do {
    if (limit.rlim_cur != RLIM_INFINITY && locked + bytes > limit.rlim_cur) {
      *why = fmt::format("{} already locked + {} would exceed RLIMIT_MEMLOCK of {}",
                         format_bytes(locked), format_bytes(bytes), format_bytes(limit.rlim_cur));
      return false;
    }
  } while (!g_locked_bytes.compare_exchange_weak(locked, locked + bytes));
  if (mlock(p, bytes) != 0) {
    *why = fmt::format("mlock failed: {}", std::strerror(errno));
    g_locked_bytes -= bytes;
    return false;
  }
  return true;
}

void unlock(void* p, size_t bytes) {
  munlock(p, bytes);
  g_locked_bytes -= bytes;
}

void warn_pageable_once(size_t bytes, Category category, const std::string& why) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  ZERO_LOG_WARN(
      "pinned memory unavailable ({} for {}: {}); using pageable host memory, so host-device "
      "copies and offload are slower. Raise `ulimit -l` to pin. Shown once per process.",
      format_bytes(bytes), category_name(category), why);
}

size_t locked_span(size_t bytes) { return (bytes + page_size() - 1) & ~(page_size() - 1); }

void free_host(void* data, size_t) { std::free(data); }

// Same rounding as at allocation, which succeeded, so it cannot overflow.
void free_locked(void* data, size_t bytes) {
  unlock(data, locked_span(bytes));
  std::free(data);
}

#ifdef ZERO_WITH_CUDA
std::string cuda_error_text(cudaError_t e) {
  (void)cudaGetLastError();  // clear it so later checks of the last error do not see it
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

void free_cuda_host(void* data, size_t) {
  cudaFreeHost(data);  // an error here (e.g. at process teardown) leaves nothing to undo
}
#endif

// The Allocation of every buffer made here and in device_buffer.cc (tracked_allocation.h).
class TrackedAllocation final : public Buffer::Allocation {
 public:
  TrackedAllocation(void* data, size_t bytes, FreeFn free, Category category, Location location,
                    MemoryTracker& tracker)
      : data_(data), bytes_(bytes), free_(free), category_(category), location_(location), tracker_(tracker) {
    tracker_.on_alloc(category_, location_, bytes_);  // throws: nothing recorded, the caller frees
  }
  ~TrackedAllocation() override {
    free_(data_, bytes_);
    tracker_.on_free(category_, location_, bytes_);
  }
  TrackedAllocation(const TrackedAllocation&) = delete;
  TrackedAllocation& operator=(const TrackedAllocation&) = delete;
  void* data() override { return data_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  FreeFn free_;
  Category category_;
  Location location_;
  MemoryTracker& tracker_;
};

}  // namespace

Buffer::Buffer(std::unique_ptr<Allocation> allocation, Location location, Category category)
    : allocation_(std::move(allocation)), location_(location), category_(category) {
  if (allocation_) {
    data_ = allocation_->data();
    bytes_ = allocation_->size_bytes();
  }
}

Buffer::Buffer(Buffer&& other) noexcept
    : allocation_(std::move(other.allocation_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      location_(other.location_),
      category_(other.category_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    allocation_ = std::move(other.allocation_);  // frees (and untracks) what this buffer held
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    location_ = other.location_;
    category_ = other.category_;
  }
  return *this;
}

Buffer make_tracked_buffer(void* data, size_t bytes, FreeFn free, Category category, Location location,
                           MemoryTracker& tracker, const char* what) {
  std::unique_ptr<TrackedAllocation> allocation;
  try {
    allocation = std::make_unique<TrackedAllocation>(data, bytes, free, category, location, tracker);
  } catch (const std::bad_alloc&) {
    // The tracker may fail to grow its own table: an AllocationError like any other.
    free(data, bytes);
    throw_allocation(bytes, what, category, "the memory tracker could not record it");
  } catch (...) {
    free(data, bytes);
    throw;
  }
  return Buffer(std::move(allocation), location, category);
}

size_t checked_bytes(int64_t count, DType dtype, Category category) {
  if (count < 0) {
    ZERO_THROW(AllocationError, "cannot allocate {} elements of {} for {}: negative element count",
               count, dtype_name(dtype), category_name(category));
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(count), dtype_size(dtype), &bytes)) {
    ZERO_THROW(AllocationError,
               "cannot allocate {} elements of {} for {}: {} x {} bytes overflows the byte size",
               count, dtype_name(dtype), category_name(category), count, dtype_size(dtype));
  }
  return bytes;
}

// ---- host ----

Buffer allocate_host(size_t bytes, Category category, MemoryTracker& tracker) {
  if (bytes == 0) return Buffer(nullptr, Location::host(), category);
  MallocPtr p = aligned_zeroed(bytes, kHostAlignment, "host", category);
  return make_tracked_buffer(p.release(), bytes, free_host, category, Location::host(), tracker, "host");
}

Buffer allocate_host_elements(int64_t count, DType dtype, Category category, MemoryTracker& tracker) {
  return allocate_host(checked_bytes(count, dtype, category), category, tracker);
}

// ---- pinned host ----

Buffer allocate_pinned(size_t bytes, Category category, MemoryTracker& tracker, PinnedKind* how) {
  PinnedKind unused;
  PinnedKind& kind = how != nullptr ? *how : unused;
  kind = PinnedKind::kPageable;
  if (bytes == 0) return Buffer(nullptr, Location::pinned_host(), category);
#ifdef ZERO_WITH_CUDA
  if (cuda_device_available()) {
    void* raw = nullptr;
    // Portable: usable as pinned memory by every device's context, not only the current one.
    const cudaError_t e = cudaHostAlloc(&raw, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) throw_allocation(bytes, "CUDA pinned host", category, cuda_error_text(e));
    std::memset(raw, 0, bytes);
    Buffer buffer = make_tracked_buffer(raw, bytes, free_cuda_host, category, Location::pinned_host(), tracker,
                                        "CUDA pinned host");
    kind = PinnedKind::kCudaHost;
    return buffer;
  }
#endif
  // Whole pages, so that locking and unlocking never touch a page shared with other allocations.
  MallocPtr p = aligned_zeroed(bytes, page_size(), "pinned host", category);
  const size_t rounded = round_up(bytes, page_size(), "pinned host", category);
  std::string why;
  if (try_lock(p.get(), rounded, &why)) {
    Buffer buffer = make_tracked_buffer(p.release(), bytes, free_locked, category, Location::pinned_host(), tracker,
                                        "pinned host");
    kind = PinnedKind::kLocked;
    return buffer;
  }
  Buffer buffer = make_tracked_buffer(p.release(), bytes, free_host, category, Location::host(), tracker, "pinned host");
  warn_pageable_once(bytes, category, why);
  return buffer;
}

Buffer allocate_pinned_elements(int64_t count, DType dtype, Category category, MemoryTracker& tracker,
                                PinnedKind* how) {
  return allocate_pinned(checked_bytes(count, dtype, category), category, tracker, how);
}

const char* pinned_kind_name(PinnedKind kind) {
  switch (kind) {
    case PinnedKind::kCudaHost: return "cuda_host";
    case PinnedKind::kLocked: return "locked";
    case PinnedKind::kPageable: return "pageable";
  }
  return "unknown";
}

bool cuda_device_available() {
#ifdef ZERO_WITH_CUDA
  // Asked once: the set of devices a process sees is fixed when the runtime initializes.
  static const bool available = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver), no device (cudaErrorNoDevice), and so on.
      ZERO_LOG_DEBUG("no CUDA device: {}", cuda_error_text(e));
      return false;
    }
    return count > 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace zero::memory
