#include "parallel/pipeline/stage_cut.h"

#include "base/check.h"

namespace zero::parallel {

int even_stage_layers(int layers, int stages, int stage) {
  ZERO_CHECK(stages >= 1 && stage >= 0 && stage < stages && layers >= 0, "stage {} of {} over {} layers", stage,
             stages, layers);
  return layers / stages + (stage < layers % stages ? 1 : 0);
}

std::pair<int, int> even_stage_range(int layers, int stages, int stage) {
  int first = 0;
  for (int k = 0; k < stage; ++k) first += even_stage_layers(layers, stages, k);
  return {first, first + even_stage_layers(layers, stages, stage)};
}

std::vector<int> even_stage_cut(int layers, int stages) {
  std::vector<int> counts;
  for (int k = 0; k < stages; ++k) counts.push_back(even_stage_layers(layers, stages, k));
  return counts;
}

std::vector<std::pair<int, int>> stage_ranges(int layers, int stages, const std::vector<int>& counts,
                                              const std::string& counts_name, const std::string& layers_name) {
  const std::vector<int> cut = counts.empty() ? even_stage_cut(layers, stages) : counts;
  if (static_cast<int>(cut.size()) != stages) {
    ZERO_THROW(InvalidArgument, "{} lists {} stages but the pipeline has {} (pp x chunks)", counts_name, cut.size(),
               stages);
  }
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (int c : cut) {
    if (c < 0) ZERO_THROW(InvalidArgument, "{}: a negative layer count {}", counts_name, c);
    ranges.emplace_back(first, first + c);
    first += c;
  }
  if (first != layers) {
    ZERO_THROW(InvalidArgument, "{} sums to {} layers but {} {}", counts_name, first, layers_name, layers);
  }
  return ranges;
}

}  // namespace zero::parallel
