#pragma once
// What travels between pipeline stages: an activation leaving a virtual stage, or the gradient of
// one coming back, as a typed buffer on a memory::Device (the host by default). Typed, and allocated
// by the device the stage computes on, so that a pipeline whose stages run on a GPU hands device
// memory straight to its send and receive, with no host copy between.
//
// The runner allocates every tensor before it calls a stage function, sized by the user's
// TensorSpec for that virtual stage: a forward fills an output of the size the next stage's receive
// expects, so a size disagreement cannot reach the wire. An empty tensor stands for "none": the first
// virtual stage's input, the last one's output.
#include <cstddef>
#include <span>

#include "base/check.h"
#include "base/dtype.h"
#include "memory/buffer.h"
#include "memory/device.h"

namespace zero::parallel {

struct TensorSpec {
  size_t numel = 0;
  DType dtype = DType::kFloat32;
  bool operator==(const TensorSpec&) const = default;
};

class StageTensor {
 public:
  StageTensor() = default;
  // `buffer` must hold spec.numel elements of spec.dtype.
  StageTensor(memory::Buffer buffer, TensorSpec spec) : buffer_(std::move(buffer)), spec_(spec) {
    ZERO_CHECK(buffer_.size_bytes() == spec_.numel * dtype_size(spec_.dtype), "stage tensor of {} bytes for {} x {}",
               buffer_.size_bytes(), spec_.numel, dtype_name(spec_.dtype));
  }

  // A tensor of `spec` in memory of `device` (zero-filled; empty for no elements).
  static StageTensor allocate(memory::Device& device, const TensorSpec& spec) {
    return StageTensor(device.allocate(spec.numel * dtype_size(spec.dtype), memory::Category::kOther), spec);
  }

  const TensorSpec& spec() const { return spec_; }
  size_t numel() const { return spec_.numel; }
  DType dtype() const { return spec_.dtype; }
  bool empty() const { return spec_.numel == 0; }
  memory::Location location() const { return buffer_.location(); }
  void* data() { return buffer_.data(); }
  const void* data() const { return buffer_.data(); }

  // Typed views; T must be the tensor's dtype (InvalidArgument naming both otherwise).
  template <typename T>
  std::span<T> span() {
    check_type(dtype_of<T>());
    return {static_cast<T*>(buffer_.data()), spec_.numel};
  }
  template <typename T>
  std::span<const T> span() const {
    check_type(dtype_of<T>());
    return {static_cast<const T*>(buffer_.data()), spec_.numel};
  }

 private:
  void check_type(DType want) const {
    if (want != spec_.dtype) {
      ZERO_THROW(InvalidArgument, "a {} view of a stage tensor of {} elements of {}", dtype_name(want), spec_.numel,
                 dtype_name(spec_.dtype));
    }
  }
  memory::Buffer buffer_;
  TensorSpec spec_;
};

}  // namespace zero::parallel
