#pragma once
// CUDA device memory as a Buffer (cudaMalloc on a given device). CUDA builds only.
//
// Accounted in `tracker` (it must outlive the buffer) at Location::cuda(device). Contents are not
// initialized (the CUDA Device zero-fills what it hands out). A failed allocation throws
// zero::AllocationError naming the size, the category, the device and the CUDA error.
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "memory/buffer.h"
#include "memory/tracker.h"

namespace zero::memory {

Buffer allocate_cuda(size_t bytes, Category category, int device, MemoryTracker& tracker = MemoryTracker::global());
Buffer allocate_cuda_elements(int64_t count, DType dtype, Category category, int device,
                              MemoryTracker& tracker = MemoryTracker::global());

}  // namespace zero::memory
