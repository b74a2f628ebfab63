#pragma once
// Files for checkpoints: written under a temporary name, fsynced and renamed into place; read with pread at an offset. Every failure is an IoError naming the file and
// the operation.
//
// Large files are written with O_DIRECT: through the page cache, a write costs the kernel about as
// much CPU time as the disk takes (docs/checkpoints.md has the figures), and that time is taken from
// training while an async save runs. Direct writes DMA from an aligned buffer of the writer's own, or
// straight from the caller's memory where it is page-aligned (SaveStaging's blocks); the kernel
// only queues them. Where the file system refuses O_DIRECT (tmpfs) the writer falls back
// to ordinary writes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zero {

class FileWriter {
 public:
  enum class Mode {
    kBuffered,  // through the page cache: small files (indexes, manifests)
    kDirect,    // O_DIRECT from an aligned buffer (falls back to kBuffered where refused)
  };
  // Creates `path` + ".tmp" (truncating an old one).
  explicit FileWriter(std::string path, Mode mode = Mode::kBuffered);
  ~FileWriter();  // an uncommitted file is removed
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  uint64_t bytes() const { return bytes_; }
  bool direct() const { return buffer_ != nullptr; }  // O_DIRECT was granted
  // fsync, close, rename to the final name.
  void commit();

 private:
  struct AlignedFree {
    void operator()(char* p) const;
  };
  void write_out(const char* p, size_t bytes, uint64_t at);  // pwrite until done
  void flush_buffer(bool last);

  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  std::unique_ptr<char[], AlignedFree> buffer_;  // direct mode: bytes not yet written
  size_t buffered_ = 0;
  uint64_t written_ = 0;  // direct mode: bytes on disk (a multiple of the alignment until the end)
};

class FileReader {
 public:
  explicit FileReader(std::string path);  // IoError naming the file when it cannot be opened
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly `bytes` at `offset`; IoError naming the file when it ends first (a truncated file).
  void read(void* out, size_t bytes, uint64_t offset) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

std::string read_whole_file(const std::string& path);
bool path_exists(const std::string& path);
// fsync of a directory, so that the renames inside it are durable.
void sync_directory(const std::string& dir);
// The swap of a complete DIR.partial into DIR: the previous checkpoint stays whole in DIR.old until
// DIR holds the new one, then DIR.old is removed.
void swap_in_directory(const std::string& partial, const std::string& dir);

}  // namespace zero
