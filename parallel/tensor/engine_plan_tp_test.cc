// The planner under tensor parallelism: the engine planned on the meta device with tensor
// parallelism's finalizer (parallel::model_parallel_finalizers) holds one tp rank's parts and counts
// the engine's own collectives over tp.
#include <doctest/doctest.h>

#include "base/error.h"
#include "parallel/engine_comms.h"
#include "zero/plan/engine_plan.h"
#include "zero/plan/plan_test_options.h"

namespace zero::plan {
namespace {

TEST_CASE("under tensor parallelism the plan holds one tp rank's parts and counts the engine's tp collectives") {
  // Two units: a split weight [512, 256] (rank's part [256, 256]), a replicated bias and two
  // partial ones, one in each unit.
  ModelSpec whole, part;
  whole.dtype = part.dtype = DType::kBFloat16;
  whole.tensors = {{"w", {512, 256}, 0}, {"ln0", {256}, 0}, {"b", {256}, 1}, {"ln", {256}, 1}};
  part.tensors = {{"w", {256, 256}, 0, true, 0, TpPlacement::split(0)},
                  {"ln0", {256}, 0, true, 0, TpPlacement::replicated_partial()},
                  {"b", {256}, 1, true, 0, TpPlacement::replicated()},
                  {"ln", {256}, 1, true, 0, TpPlacement::replicated_partial()}};
  for (int stage : {0, 2, 3}) {
    CAPTURE(stage);
    const EnginePlan p = plan_engine({.model = part, .options = plan_test_options(stage), .world_size = 2, .tp = 2,
                                        .finalizers = parallel::model_parallel_finalizers});
    const EnginePlan w = plan_engine({.model = whole, .options = plan_test_options(stage), .world_size = 2});
    CHECK(p.memory.formula_predicted() < w.memory.formula_predicted() * 0.6);
    // One sum of squares per step, and the partial biases' owned pieces summed over tp in one
    // packed call (not one per piece).
    REQUIRE(p.tp_traffic.count("all_reduce"));
    const comm::CollectiveTally& t = p.tp_traffic.at("all_reduce");
    CHECK(t.calls == 2);
    // The norm's per-unit sums of squares (a double for each of the 2 units), and the partial
    // biases' owned pieces: both whole in bf16 at stage 0 (the gradient's dtype); at stages 2 and
    // 3 the fp32 accumulator's, where the plan's rank owns one of the two whole and its
    // data-parallel peer the other (a lone piece goes in place: no pack).
    CHECK(t.payload_bytes == 2 * 8 + (stage == 0 ? 2 * 256 * 2 : 256 * 4));
    CHECK(w.tp_traffic.empty());
  }
}

TEST_CASE("a tensor-parallel plan without the finalizers is refused") {
  ModelSpec part;
  part.tensors = {{"w", {256, 256}, 0, true, 0, TpPlacement::split(0)}};
  CHECK_THROWS_WITH_AS(plan_engine({.model = part, .options = plan_test_options(1), .world_size = 2, .tp = 2}),
                       "plan: tp 2 without PlanInputs.finalizers (parallel::model_parallel_finalizers)", InvalidArgument);
}

}  // namespace
}  // namespace zero::plan
