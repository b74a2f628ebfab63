#pragma once
// How a model's repeated layers fall into the virtual stages of a pipeline when the user gives no
// cut: as evenly as they go, the first stages one more where the count does not divide (5 layers
// over 2 stages: 3 and 2). The GPT example's pipeline cuts its blocks this way and the strategy
// planner's described models assume it, so the two cannot drift apart.
#include <string>
#include <utility>
#include <vector>

namespace zero::parallel {

// Layers of virtual stage `stage` of `stages` (0 <= stage < stages, stages >= 1, layers >= 0).
int even_stage_layers(int layers, int stages, int stage);
// {first layer, end layer} of virtual stage `stage` under the even cut.
std::pair<int, int> even_stage_range(int layers, int stages, int stage);
// Every stage's count, in order (sums to `layers`).
std::vector<int> even_stage_cut(int layers, int stages);

// Each stage's {first layer, end layer}: `counts` (one per stage), or the even cut when it is empty.
// Throws InvalidArgument naming `counts_name` (how the caller's user wrote the counts: a flag, an
// option field) for a list of the wrong length, a negative count, or a sum other than `layers`
// (described by `layers_name`: "the model has n_layer").
std::vector<std::pair<int, int>> stage_ranges(int layers, int stages, const std::vector<int>& counts,
                                              const std::string& counts_name, const std::string& layers_name);

}  // namespace zero::parallel
