#pragma once
// Internal to the Device implementations: a Buffer::Allocation that owns one of the typed buffers
// (HostBuffer, PinnedBuffer, DeviceBuffer), which does the freeing and the tracker accounting.
#include <cstddef>
#include <utility>

#include "memory/device.h"

namespace zero::memory {

template <typename B>
class OwnedAllocation final : public Buffer::Allocation {
 public:
  explicit OwnedAllocation(B buffer) : buffer_(std::move(buffer)) {}
  void* data() override { return buffer_.data(); }
  size_t size_bytes() const override { return buffer_.size_bytes(); }

 private:
  B buffer_;
};

}  // namespace zero::memory
