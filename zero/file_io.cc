#include "zero/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "base/check.h"
#include "zero/crc32c.h"

namespace zero {
namespace {

std::string why() { return std::strerror(errno); }

}  // namespace

FileWriter::FileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ZERO_THROW(IoError, "'{}': cannot create: {}", tmp_, why());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void FileWriter::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::write(fd_, p + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) ZERO_THROW(IoError, "'{}': write failed after {} bytes: {}", tmp_, bytes_ + done, why());
    done += static_cast<size_t>(w);
  }
  crc_ = zero::crc32c(data, bytes, crc_);
  bytes_ += bytes;
}

void FileWriter::commit() {
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

}  // namespace zero
