// The GPT example's model trained by the engine follows PyTorch's data-parallel run at every stage,
// at the reference's 2 ranks and on 1 rank with 2 micro-steps, with and without optimizer offload.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {

TEST_CASE("GPT training follows PyTorch at stages 0-3") {
  const std::string file = "tests/data/pytorch/gpt/gpt_tiny_dp2.json";
  for (const char* stage : {"0", "1", "2", "3"}) {
    for (int nproc : {2, 1}) {
      CAPTURE(stage);
      CAPTURE(nproc);
      const auto r = testing::launch(nproc, "tests/gpt_reference_worker", {"--file", file, "--stage", stage});
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
    }
  }
  const auto r = testing::launch(2, "tests/gpt_reference_worker", {"--file", file, "--stage", "3", "--offload"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

}  // namespace zero
