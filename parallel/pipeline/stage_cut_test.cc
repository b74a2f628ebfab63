#include "parallel/pipeline/stage_cut.h"

#include <doctest/doctest.h>

#include <cstddef>
#include <numeric>

namespace zero::parallel {

TEST_CASE("the even cut gives the first stages one more layer and covers every layer once") {
  CHECK(even_stage_cut(5, 2) == std::vector<int>{3, 2});
  CHECK(even_stage_cut(4, 4) == std::vector<int>{1, 1, 1, 1});
  CHECK(even_stage_cut(32, 6) == std::vector<int>{6, 6, 5, 5, 5, 5});
  CHECK(even_stage_cut(2, 4) == std::vector<int>{1, 1, 0, 0});
  for (int layers = 0; layers <= 13; ++layers) {
    for (int stages = 1; stages <= 8; ++stages) {
      const std::vector<int> cut = even_stage_cut(layers, stages);
      CHECK(std::accumulate(cut.begin(), cut.end(), 0) == layers);
      int end = 0;
      for (int s = 0; s < stages; ++s) {
        const auto [first, last] = even_stage_range(layers, stages, s);
        CHECK(first == end);  // contiguous, in order
        CHECK(last - first == cut[static_cast<size_t>(s)]);
        CHECK(cut.front() - cut[static_cast<size_t>(s)] <= 1);  // as even as they go
        end = last;
      }
      CHECK(end == layers);
    }
  }
}

}  // namespace zero::parallel
