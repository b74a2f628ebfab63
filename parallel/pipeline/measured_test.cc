// measure() of a simulated timeline gives the simulator's own step time and bubble; measured_costs()
// of it gives back the costs it was simulated with (per virtual stage, BW as B); the spans survive
// packing for a collective and print as JSON.
#include "parallel/pipeline/measured.h"

#include <doctest/doctest.h>

#include "parallel/pipeline/schedule_sim.h"
#include "parallel/pipeline/schedules.h"

namespace zero::parallel {
namespace {

TEST_CASE("a simulated timeline measures as the simulator says, and gives back its costs") {
  for (const Schedule& s : {one_f_one_b(4, 8), zb_h1(4, 8), interleaved_1f1b(2, 4, 2)}) {
    CAPTURE(s.name);
    ActionCosts costs;
    costs.forward.clear();
    costs.backward.clear();
    costs.weight.clear();
    for (int k = 0; k < s.virtual_stages(); ++k) {
      costs.forward.push_back(1.0 + 0.25 * k);
      costs.backward.push_back(2.0 + 0.5 * k);
      costs.weight.push_back(s.split_backward ? 1.0 : 0.0);
    }
    const SimResult sim = simulate(s, costs);
    const MeasuredStep m = measure(sim.timeline);
    CHECK(m.step_time == doctest::Approx(sim.step_time));
    CHECK(m.bubble_fraction == doctest::Approx(sim.bubble_fraction));
    const ActionCosts back = measured_costs(s, sim.timeline);
    for (int k = 0; k < s.virtual_stages(); ++k) {
      CHECK(back.forward[static_cast<size_t>(k)] == doctest::Approx(costs.forward[static_cast<size_t>(k)]));
      CHECK(back.backward[static_cast<size_t>(k)] == doctest::Approx(costs.backward[static_cast<size_t>(k)]));
    }
    CHECK(simulate(s, back).step_time == doctest::Approx(sim.step_time));
    const std::vector<double> packed = pack_spans(sim.timeline[1]);
    const std::vector<Span> unpacked = unpack_spans(packed.data(), packed.size() / 5);
    REQUIRE(unpacked.size() == sim.timeline[1].size());
    CHECK(unpacked.back().action == sim.timeline[1].back().action);
    CHECK(unpacked.back().end == sim.timeline[1].back().end);
    CHECK(spans_json(s, sim.timeline).find(R"("op": "F", "mb": 0, "chunk": 0)") != std::string::npos);
  }
}

}  // namespace
}  // namespace zero::parallel
