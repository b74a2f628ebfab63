#include "memory/device.h"

#include <utility>

#include "memory/buffer.h"
#include "memory/owned_allocation.h"

namespace zero::memory {

Buffer::Buffer(std::unique_ptr<Allocation> allocation, DeviceKind kind, Category category)
    : allocation_(std::move(allocation)), kind_(kind), category_(category) {
  if (allocation_) {
    data_ = allocation_->data();
    bytes_ = allocation_->size_bytes();
  }
}

Buffer::Buffer(Buffer&& other) noexcept
    : allocation_(std::move(other.allocation_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      kind_(other.kind_),
      category_(other.category_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    allocation_ = std::move(other.allocation_);  // frees (and untracks) what this buffer held
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
    category_ = other.category_;
  }
  return *this;
}

Buffer Device::allocate_elements(int64_t count, DType dtype, Category category) {
  return allocate(checked_bytes(count, dtype, category), category);
}

Buffer Device::allocate_host_staging(size_t bytes, Category category) {
  return allocate_host_staging(bytes, category, tracker());
}

Buffer Device::allocate_host_staging(size_t bytes, Category category, MemoryTracker& tracker) {
  if (bytes == 0) return Buffer(nullptr, DeviceKind::kPinnedHost, category);
  PinnedBuffer pinned(bytes, category, tracker);
  const DeviceKind kind = pinned.kind() == PinnedBuffer::Kind::kPageable ? DeviceKind::kHost : DeviceKind::kPinnedHost;
  return Buffer(std::make_unique<OwnedAllocation<PinnedBuffer>>(std::move(pinned)), kind, category);
}

}  // namespace zero::memory
