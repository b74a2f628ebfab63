#pragma once
// How a model's repeated layers fall into the virtual stages of a pipeline when the user gives no
// cut: as evenly as they go, the first stages one more where the count does not divide (5 layers
// over 2 stages: 3 and 2). The GPT example's pipeline cuts its blocks this way and the strategy
// planner's described models assume it, so the two cannot drift apart.
#include <utility>
#include <vector>

namespace zero::parallel {

// Layers of virtual stage `stage` of `stages` (0 <= stage < stages, stages >= 1, layers >= 0).
int even_stage_layers(int layers, int stages, int stage);
// {first layer, end layer} of virtual stage `stage` under the even cut.
std::pair<int, int> even_stage_range(int layers, int stages, int stage);
// Every stage's count, in order (sums to `layers`).
std::vector<int> even_stage_cut(int layers, int stages);

}  // namespace zero::parallel
