#pragma once
// Files for checkpoints: written under a temporary name, checksummed as they go, fsynced and
// renamed into place; read with pread at an offset. Every failure is an IoError naming the file and
// the operation.
#include <cstddef>
#include <cstdint>
#include <string>

namespace zero {

class FileWriter {
 public:
  // Creates `path` + ".tmp" (truncating an old one).
  explicit FileWriter(std::string path);
  ~FileWriter();  // an uncommitted file is removed
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32c() const { return crc_; }
  // fsync, close, rename to the final name.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
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

}  // namespace zero
