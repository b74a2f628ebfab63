// The planner against the GPT example's real training, ranks as processes (so each rank's
// communicator scratch is its own): zero_bench --check fails when any rank's planned category or
// total differs from the measured one by more than 2% (and 64 KiB), at every stage, with the
// optimizer and the parameters offloaded, at N = 2 and 3.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {

TEST_CASE("zero_bench: the plan equals the GPT's measured memory within 2% at every configuration") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto r = testing::launch(world, "examples/bench/zero_bench",
                                   {"--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--block-size", "32",
                                    "--batch", std::to_string(world), "--steps", "2", "--check", "0.02", "--configs",
                                    "0,1,2,3,0+offload,1+offload,2+offload,3+offload,3+offload-params"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("3+offload-params") != std::string::npos);
    CHECK(r.output.find("plan/m") != std::string::npos);
  }
}

}  // namespace zero
