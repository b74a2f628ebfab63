#include "zero/checkpoint/save_staging.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/check.h"

namespace zero {
void SaveStaging::Free::operator()(char* p) const { std::free(p); }

SaveStaging::SaveStaging(size_t block_bytes) : block_bytes_(block_bytes) {
  ZERO_CHECK(block_bytes > 0 && block_bytes % 4096 == 0, "staging blocks of {} bytes: must be a multiple of 4096",
             block_bytes);
}

uint64_t SaveStaging::append(const void* data, size_t bytes) {
  const uint64_t start = size_;
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t block = static_cast<size_t>(size_ / block_bytes_), at = static_cast<size_t>(size_ % block_bytes_);
    if (block == blocks_.size()) {
      char* b = static_cast<char*>(std::aligned_alloc(4096, block_bytes_));
      if (b == nullptr) ZERO_THROW(AllocationError, "no host memory for {} more bytes of checkpoint staging", block_bytes_);
      blocks_.emplace_back(b);
    }
    const size_t n = std::min(bytes, block_bytes_ - at);
    std::memcpy(blocks_[block].get() + at, p, n);
    p += n;
    bytes -= n;
    size_ += n;
  }
  return start;
}

void SaveStaging::for_each_span(uint64_t offset, uint64_t bytes,
                                const std::function<void(const char*, size_t)>& fn) const {
  ZERO_CHECK(offset <= size_ && bytes <= size_ - offset, "span [{}, {}) is past the staging's {} bytes", offset,
             offset + bytes, size_);
  while (bytes > 0) {
    const size_t block = static_cast<size_t>(offset / block_bytes_), at = static_cast<size_t>(offset % block_bytes_);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, block_bytes_ - at));
    fn(blocks_[block].get() + at, n);
    offset += n;
    bytes -= n;
  }
}

}  // namespace zero
