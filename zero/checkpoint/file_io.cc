#include "zero/checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "base/check.h"

namespace zero {
namespace {

std::string why() { return std::strerror(errno); }

// O_DIRECT's alignment of buffer, offset and length: 4096 covers every logical block size in use.
constexpr size_t kDirectAlign = 4096;
// One direct write: large enough that the per-request cost vanishes, small enough to stay in cache.
constexpr size_t kDirectChunk = size_t{8} << 20;

}  // namespace

void FileWriter::AlignedFree::operator()(char* p) const { std::free(p); }

FileWriter::FileWriter(std::string path, Mode mode) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (mode == Mode::kDirect) {
    fd_ = ::open(tmp_.c_str(), kFlags | O_DIRECT, 0644);
    if (fd_ >= 0) {
      buffer_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlign, kDirectChunk)));
      if (!buffer_) ZERO_THROW(IoError, "'{}': no memory for a {}-byte write buffer", tmp_, kDirectChunk);
      return;
    }
    if (errno != EINVAL) ZERO_THROW(IoError, "'{}': cannot create: {}", tmp_, why());
  }
  fd_ = ::open(tmp_.c_str(), kFlags, 0644);
  if (fd_ < 0) ZERO_THROW(IoError, "'{}': cannot create: {}", tmp_, why());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void FileWriter::write_out(const char* p, size_t bytes, uint64_t at) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(at + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) ZERO_THROW(IoError, "'{}': write failed after {} bytes: {}", tmp_, at + done, why());
    done += static_cast<size_t>(w);
  }
}

void FileWriter::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  bytes_ += bytes;
  if (!direct()) {
    write_out(p, bytes, bytes_ - bytes);
    return;
  }
  while (bytes > 0) {
    if (buffered_ == 0 && reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0 && bytes >= kDirectAlign) {
      const size_t whole = bytes / kDirectAlign * kDirectAlign;  // straight from the caller's memory
      write_out(p, whole, written_);
      written_ += whole;
      p += whole;
      bytes -= whole;
      continue;
    }
    const size_t n = std::min(bytes, kDirectChunk - buffered_);
    std::memcpy(buffer_.get() + buffered_, p, n);
    buffered_ += n;
    p += n;
    bytes -= n;
    if (buffered_ == kDirectChunk) flush_buffer(false);
  }
}

// Writes the buffer out. The last write is padded to the alignment, and the file then cut to its
// length (ftruncate), since O_DIRECT cannot write a partial block.
void FileWriter::flush_buffer(bool last) {
  if (buffered_ == 0) return;
  const size_t padded = (buffered_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  ZERO_CHECK(last || padded == buffered_, "a direct write before the end must be whole blocks");
  std::memset(buffer_.get() + buffered_, 0, padded - buffered_);
  write_out(buffer_.get(), padded, written_);
  written_ += buffered_;
  buffered_ = 0;
  if (last && ::ftruncate(fd_, static_cast<off_t>(written_)) != 0) {
    ZERO_THROW(IoError, "'{}': cannot set its length to {} bytes: {}", tmp_, written_, why());
  }
}

void FileWriter::commit() {
  if (direct()) flush_buffer(true);
  if (::fsync(fd_) != 0) ZERO_THROW(IoError, "'{}': fsync failed: {}", tmp_, why());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) ZERO_THROW(IoError, "'{}': close failed: {}", tmp_, why());
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ZERO_THROW(IoError, "'{}': cannot rename to '{}': {}", tmp_, path_, why());
  }
}

FileReader::FileReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) ZERO_THROW(IoError, "'{}': cannot open: {}", path_, why());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    ZERO_THROW(IoError, "'{}': cannot stat: {}", path_, why());
  }
  size_ = static_cast<uint64_t>(st.st_size);
  // Checkpoint pieces are read front to back: a larger read-ahead window.
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::read(void* out, size_t bytes, uint64_t offset) const {
  if (offset > size_ || bytes > size_ - offset) {
    ZERO_THROW(IoError, "'{}': {} bytes at offset {} are past its end ({} bytes): the file is truncated", path_,
               bytes, offset, size_);
  }
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd_, static_cast<char*>(out) + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) ZERO_THROW(IoError, "'{}': read failed at byte {}: {}", path_, offset + done, r < 0 ? why() : "end of file");
    done += static_cast<size_t>(r);
  }
}

std::string read_whole_file(const std::string& path) {
  FileReader f(path);
  std::string s(f.size(), '\0');
  f.read(s.data(), s.size(), 0);
  return s;
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ZERO_THROW(IoError, "'{}': cannot open the directory: {}", dir, why());
  const int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) ZERO_THROW(IoError, "'{}': fsync of the directory failed: {}", dir, why());
}

void swap_in_directory(const std::string& partial, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string old = dir + ".old";
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(partial, dir);
  sync_directory(fs::absolute(fs::path(dir)).parent_path().string());
  fs::remove_all(old);
}

}  // namespace zero
