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

// Reports a successful allocation. The tracker may fail to grow its own table; that surfaces as an
// AllocationError too, and the caller still owns (and frees) the memory.
void track(MemoryTracker& tracker, Category category, Location location, size_t bytes,
           const char* what) {
  try {
    tracker.on_alloc(category, location, bytes);
  } catch (const std::bad_alloc&) {
    throw_allocation(bytes, what, category, "the memory tracker could not record it");
  }
}

// ---- page locking for PinnedBuffer without CUDA ----

// Bytes this process has locked through PinnedBuffer. RLIMIT_MEMLOCK is applied to this count as a
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

Location tracked_location(PinnedBuffer::Kind kind) {
  return kind == PinnedBuffer::Kind::kPageable ? Location::host() : Location::pinned_host();
}

#ifdef ZERO_WITH_CUDA
std::string cuda_error_text(cudaError_t e) {
  (void)cudaGetLastError();  // clear it so later checks of the last error do not see it
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}
#endif

}  // namespace

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

// ---- HostBuffer ----

HostBuffer::HostBuffer(size_t bytes, Category category, MemoryTracker& tracker)
    : category_(category) {
  if (bytes == 0) return;
  MallocPtr p = aligned_zeroed(bytes, kAlignment, "host", category);
  track(tracker, category, Location::host(), bytes, "host");
  data_ = p.release();
  bytes_ = bytes;
  tracker_ = &tracker;
}

HostBuffer HostBuffer::for_elements(int64_t count, DType dtype, Category category,
                                    MemoryTracker& tracker) {
  return HostBuffer(checked_bytes(count, dtype, category), category, tracker);
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      tracker_(std::exchange(other.tracker_, nullptr)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    tracker_ = std::exchange(other.tracker_, nullptr);
  }
  return *this;
}

void HostBuffer::release() {
  if (data_ == nullptr) return;
  std::free(data_);
  tracker_->on_free(category_, Location::host(), bytes_);
  data_ = nullptr;
  bytes_ = 0;
  tracker_ = nullptr;
}

// ---- PinnedBuffer ----

PinnedBuffer::PinnedBuffer(size_t bytes, Category category, MemoryTracker& tracker)
    : category_(category) {
  if (bytes == 0) return;
#ifdef ZERO_WITH_CUDA
  if (cuda_device_available()) {
    void* raw = nullptr;
    // Portable: usable as pinned memory by every device's context, not only the current one.
    const cudaError_t e = cudaHostAlloc(&raw, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) throw_allocation(bytes, "CUDA pinned host", category, cuda_error_text(e));
    std::memset(raw, 0, bytes);
    try {
      track(tracker, category, Location::pinned_host(), bytes, "CUDA pinned host");
    } catch (...) {
      cudaFreeHost(raw);
      throw;
    }
    data_ = raw;
    bytes_ = bytes;
    kind_ = Kind::kCudaHost;
    tracker_ = &tracker;
    return;
  }
#endif
  // Whole pages, so that locking and unlocking never touch a page shared with other allocations.
  const size_t page = page_size();
  MallocPtr p = aligned_zeroed(bytes, page, "pinned host", category);
  const size_t rounded = round_up(bytes, page, "pinned host", category);
  std::string why;
  const Kind kind = try_lock(p.get(), rounded, &why) ? Kind::kLocked : Kind::kPageable;
  try {
    track(tracker, category, tracked_location(kind), bytes, "pinned host");
  } catch (...) {
    if (kind == Kind::kLocked) unlock(p.get(), rounded);
    throw;
  }
  if (kind == Kind::kPageable) warn_pageable_once(bytes, category, why);
  data_ = p.release();
  bytes_ = bytes;
  kind_ = kind;
  tracker_ = &tracker;
}

PinnedBuffer PinnedBuffer::for_elements(int64_t count, DType dtype, Category category,
                                        MemoryTracker& tracker) {
  return PinnedBuffer(checked_bytes(count, dtype, category), category, tracker);
}

PinnedBuffer::~PinnedBuffer() { release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      kind_(std::exchange(other.kind_, Kind::kPageable)),
      tracker_(std::exchange(other.tracker_, nullptr)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    kind_ = std::exchange(other.kind_, Kind::kPageable);
    tracker_ = std::exchange(other.tracker_, nullptr);
  }
  return *this;
}

void PinnedBuffer::release() {
  if (data_ == nullptr) return;
  switch (kind_) {
    case Kind::kCudaHost:
#ifdef ZERO_WITH_CUDA
      cudaFreeHost(data_);  // an error here (e.g. at process teardown) leaves nothing to undo
#endif
      break;
    case Kind::kLocked:
      // Same rounding as at allocation, which succeeded, so it cannot overflow.
      unlock(data_, (bytes_ + page_size() - 1) & ~(page_size() - 1));
      std::free(data_);
      break;
    case Kind::kPageable:
      std::free(data_);
      break;
  }
  tracker_->on_free(category_, tracked_location(kind_), bytes_);
  data_ = nullptr;
  bytes_ = 0;
  kind_ = Kind::kPageable;
  tracker_ = nullptr;
}

const char* pinned_kind_name(PinnedBuffer::Kind kind) {
  switch (kind) {
    case PinnedBuffer::Kind::kCudaHost: return "cuda_host";
    case PinnedBuffer::Kind::kLocked: return "locked";
    case PinnedBuffer::Kind::kPageable: return "pageable";
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
