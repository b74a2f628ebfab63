// SaveStaging: appends across block boundaries come back in order through for_each_span, every block
// is page-aligned (what O_DIRECT needs), and clear() keeps the blocks for the next save.
#include "zero/checkpoint/save_staging.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "base/error.h"

namespace zero {

TEST_CASE("appends across blocks read back in order, from page-aligned blocks kept between uses") {
  SaveStaging staging(4096);
  std::string all;
  for (int i = 0; i < 7; ++i) {
    const std::string part(static_cast<size_t>(1000 + 1500 * i), static_cast<char>('a' + i));
    CHECK(staging.append(part.data(), part.size()) == all.size());
    all += part;
  }
  CHECK(staging.size() == all.size());
  const size_t reserved = staging.reserved_bytes();
  CHECK(reserved == (all.size() + 4095) / 4096 * 4096);
  std::string back;
  staging.for_each_span(0, staging.size(), [&](const char* p, size_t n) {
    if (back.size() % 4096 == 0) CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
    back.append(p, n);
  });
  CHECK(back == all);
  std::string middle;
  staging.for_each_span(4000, 9000, [&](const char* p, size_t n) { middle.append(p, n); });
  CHECK(middle == all.substr(4000, 9000));
  CHECK_THROWS_AS(staging.for_each_span(all.size() - 1, 2, [](const char*, size_t) {}), Error);

  staging.clear();
  CHECK(staging.size() == 0);
  CHECK(staging.append("xyz", 3) == 0);
  CHECK(staging.reserved_bytes() == reserved);
  staging.release();
  CHECK(staging.reserved_bytes() == 0);
  CHECK(staging.append("xyz", 3) == 0);
  CHECK_THROWS_AS(SaveStaging(1000), Error);
}

}  // namespace zero
