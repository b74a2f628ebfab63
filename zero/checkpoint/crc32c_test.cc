#include "zero/checkpoint/crc32c.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace zero {

TEST_CASE("CRC-32C check values") {
  CHECK(crc32c("", 0) == 0u);
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // the standard check value of CRC-32C
  const std::vector<unsigned char> zeros(32, 0);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const std::vector<unsigned char> ones(32, 0xFF);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of 0xFF
}

TEST_CASE("the instruction path and the tables agree") {
  std::string s;
  for (int i = 0; i < 4099; ++i) s.push_back(static_cast<char>(i * 131 + 17));
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{63}, size_t{4099}}) {
    CAPTURE(n);
    CHECK(crc32c(s.data(), n) == crc32c_portable(s.data(), n));
    CHECK(crc32c(s.data() + 3, n > 3 ? n - 3 : 0, 0x1234u) == crc32c_portable(s.data() + 3, n > 3 ? n - 3 : 0, 0x1234u));
  }
  CHECK(crc32c_portable("123456789", 9) == 0xE3069283u);
}

TEST_CASE("the three-stream instruction path agrees with the tables across block boundaries") {
  const size_t lane = size_t{32} << 10;  // crc32c.cc's stream length
  std::string s;
  for (size_t i = 0; i < 7 * lane + 100; ++i) s.push_back(static_cast<char>((i * 2654435761u) >> 11));
  for (size_t n : {3 * lane - 1, 3 * lane, 3 * lane + 1, 3 * lane + 8, 6 * lane, 7 * lane + 99}) {
    CAPTURE(n);
    CHECK(crc32c(s.data(), n) == crc32c_portable(s.data(), n));
    CHECK(crc32c(s.data() + 1, n, 0xDEADBEEFu) == crc32c_portable(s.data() + 1, n, 0xDEADBEEFu));
  }
}

TEST_CASE("combine gives the checksum of the concatenation") {
  std::string s;
  for (int i = 0; i < 300000; ++i) s.push_back(static_cast<char>(i * 13 + 5));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{8}, size_t{4096}, size_t{123457}, s.size()}) {
    CAPTURE(cut);
    const uint32_t a = crc32c(s.data(), cut), b = crc32c(s.data() + cut, s.size() - cut);
    CHECK(crc32c_combine(a, b, s.size() - cut) == crc32c(s.data(), s.size()));
  }
  CHECK(crc32c_combine(crc32c("1234", 4), crc32c("56789", 5), 5) == 0xE3069283u);
}

TEST_CASE("incremental over any split equals one pass") {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(static_cast<char>(i * 7 + 3));
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{500}, size_t{999}}) {
    CAPTURE(cut);
    CHECK(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)) == whole);
  }
}

}  // namespace zero
