#pragma once
// SaveStaging: the host memory an async save copies the rank's pieces into, so that training can
// go on changing the engine's state while the copy is written. The bytes are laid out as the data
// file will be (appended back to back), in page-aligned blocks that the writer hands to the disk as
// they are (O_DIRECT from this memory: no second copy). The engine keeps the blocks from one save to
// the next, so a save after the first copies into memory already mapped: faulting in fresh pages
// took five times as long as the copy (docs/checkpoints.md). Huge pages (MADV_HUGEPAGE) are not
// asked for: the kernel's compaction on their first fault stalled the copy longer still.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace zero {

class SaveStaging {
 public:
  static constexpr size_t kBlockBytes = size_t{64} << 20;

  // `block_bytes`: a multiple of 4096, the largest O_DIRECT alignment (tests use small blocks).
  explicit SaveStaging(size_t block_bytes = kBlockBytes);
  SaveStaging(const SaveStaging&) = delete;
  SaveStaging& operator=(const SaveStaging&) = delete;

  void clear() { size_ = 0; }  // keeps the blocks
  void release() {              // frees them
    blocks_.clear();
    size_ = 0;
  }
  // Appends `bytes` (growing by blocks); returns the offset they start at.
  uint64_t append(const void* data, size_t bytes);
  uint64_t size() const { return size_; }
  size_t reserved_bytes() const { return blocks_.size() * block_bytes_; }
  // Calls fn(pointer, length) for the contiguous spans of [offset, offset + bytes), in order.
  void for_each_span(uint64_t offset, uint64_t bytes, const std::function<void(const char*, size_t)>& fn) const;

 private:
  struct Free {
    void operator()(char* p) const;
  };
  size_t block_bytes_;
  std::vector<std::unique_ptr<char[], Free>> blocks_;
  uint64_t size_ = 0;
};

}  // namespace zero
