// FileWriter in both modes: what is read back is what was written, whatever the sizes of the writes
// and of the file (a direct write's last block is padded, then the file cut to length); the running
// checksum is the file's; an uncommitted file is gone.
#include "zero/checkpoint/file_io.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace zero {
namespace {

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::vector<char> pattern(size_t n, unsigned seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 2654435761u + seed) >> 13);
  return v;
}

}  // namespace

TEST_CASE("what is read back is what was written, in both modes, at any sizes") {
  const size_t chunk = size_t{8} << 20;
  const std::vector<std::vector<size_t>> cases = {
      {}, {1}, {4095}, {4096}, {4097}, {chunk}, {chunk + 3}, {chunk - 1, 2, 4096, 3}, {100, 200, 2 * chunk + 5000, 7}};
  for (FileWriter::Mode mode : {FileWriter::Mode::kBuffered, FileWriter::Mode::kDirect}) {
    for (const std::vector<size_t>& writes : cases) {
      const std::string path = tmp("file_io_case");
      std::vector<char> all;
      {
        FileWriter w(path, mode);
        unsigned seed = 1;
        for (size_t n : writes) {
          const std::vector<char> part = pattern(n, seed++);
          w.write(part.data(), part.size());
          all.insert(all.end(), part.begin(), part.end());
        }
        CHECK(w.bytes() == all.size());
        w.commit();
      }
      CAPTURE(writes.size());
      CAPTURE(all.size());
      const std::string back = read_whole_file(path);
      REQUIRE(back.size() == all.size());
      CHECK(std::equal(back.begin(), back.end(), all.begin()));
    }
  }
}

TEST_CASE("page-aligned memory is written straight from the caller, and what follows it is buffered") {
  const size_t chunk = size_t{8} << 20, n = 2 * chunk + 3 * 4096 + 77;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t room = (n + 4095) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> aligned(static_cast<char*>(std::aligned_alloc(4096, room)), &std::free);
  REQUIRE(aligned != nullptr);
  const std::vector<char> data = pattern(n, 9);
  std::memcpy(aligned.get(), data.data(), n);
  const std::string path = tmp("file_io_aligned");
  {
    FileWriter w(path, FileWriter::Mode::kDirect);
    w.write(aligned.get(), n);       // whole blocks from the caller, 77 bytes into the buffer
    w.write(aligned.get(), 4096);    // buffered: the buffer is not empty
    w.write(aligned.get() + 1, 10);  // unaligned
    w.commit();
  }
  std::string want(data.begin(), data.end());
  want.append(data.data(), 4096);
  want.append(data.data() + 1, 10);
  CHECK(read_whole_file(path) == want);
}

TEST_CASE("direct mode is granted on the test's file system or falls back, and an uncommitted file is removed") {
  const std::string path = tmp("file_io_uncommitted");
  {
    FileWriter w(path, FileWriter::Mode::kDirect);
    MESSAGE("O_DIRECT " << std::string(w.direct() ? "granted" : "refused (buffered fallback)"));
    const std::vector<char> part = pattern(10000, 3);
    w.write(part.data(), part.size());
    CHECK(path_exists(path + ".tmp"));
  }
  CHECK_FALSE(path_exists(path + ".tmp"));
  CHECK_FALSE(path_exists(path));
  // /dev/shm is tmpfs, which refuses O_DIRECT: the writer falls back to ordinary writes.
  if (path_exists("/dev/shm")) {
    const std::string shm = "/dev/shm/zero_file_io_test_" + std::to_string(::getpid());
    FileWriter w(shm, FileWriter::Mode::kDirect);
    const std::vector<char> part = pattern(5000, 4);
    w.write(part.data(), part.size());
    w.commit();
    CHECK(read_whole_file(shm) == std::string(part.begin(), part.end()));
    std::remove(shm.c_str());
  }
}

}  // namespace zero
