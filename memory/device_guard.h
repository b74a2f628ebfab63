#pragma once
// Makes a CUDA device current for a scope and restores the previous one on exit. CUDA builds only.
#include <cuda_runtime.h>

#include "memory/cuda_check.h"

namespace zero::memory {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    ZERO_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) ZERO_CUDA_CHECK(cudaSetDevice(device));
    current_ = device;
  }
  ~DeviceGuard() {
    // Restoring cannot fail for a device that was current before; nothing to report if it does.
    if (current_ != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int current_ = 0;
};

}  // namespace zero::memory
