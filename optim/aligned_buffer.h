#pragma once
// A zero-filled, 64-byte aligned, move-only host allocation for optimizer state (a cache line and one
// AVX-512 vector, so the state arrays of a shard start aligned).
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "base/check.h"

namespace zero::optim {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = ::operator new(bytes, std::align_val_t{kAlignment}, std::nothrow);
    if (p == nullptr) ZERO_THROW(AllocationError, "cannot allocate {} bytes of optimizer state", bytes);
    data_.reset(p);
    std::memset(p, 0, bytes);
  }

  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::move(other.data_)), bytes_(std::exchange(other.bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    data_ = std::move(other.data_);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
  }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  size_t size_bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const { ::operator delete(p, std::align_val_t{kAlignment}); }
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
};

}  // namespace zero::optim
