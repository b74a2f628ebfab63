#include "parallel/pipeline/stage_cut.h"

#include <doctest/doctest.h>

#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "base/error.h"

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

TEST_CASE("stage_ranges: the even cut or the given counts, and bad counts named as the caller names them") {
  using Ranges = std::vector<std::pair<int, int>>;
  CHECK(stage_ranges(5, 2, {}, "counts", "layers") == Ranges{{0, 3}, {3, 5}});
  CHECK(stage_ranges(4, 3, {0, 4, 0}, "counts", "layers") == Ranges{{0, 0}, {0, 4}, {4, 4}});
  CHECK_THROWS_WITH_AS(stage_ranges(4, 3, {2, 2}, "--pp-layers", "n_layer is"),
                       "--pp-layers lists 2 stages but the pipeline has 3 (pp x chunks)", InvalidArgument);
  CHECK_THROWS_WITH_AS(stage_ranges(4, 2, {5, -1}, "--pp-layers", "n_layer is"), "--pp-layers: a negative layer count -1",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(stage_ranges(4, 2, {1, 2}, "--pp-layers", "n_layer is"),
                       "--pp-layers sums to 3 layers but n_layer is 4", InvalidArgument);
}

}  // namespace zero::parallel
