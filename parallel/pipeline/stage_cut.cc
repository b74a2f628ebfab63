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

}  // namespace zero::parallel
