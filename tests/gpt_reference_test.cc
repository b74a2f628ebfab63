// The GPT example's model trained by the engine follows PyTorch's data-parallel run at every stage,
// at the reference's 2 ranks and on 1 rank with 2 micro-steps, with and without optimizer offload;
// and split over tensor-parallel ranks: gpt_4layer_dp2 at tp 2 and 4 with dp 1 and 2, stages 0-3,
// with and without sequence parallelism, and with offload at stage 3.
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

TEST_CASE("GPT training split over tensor-parallel ranks follows PyTorch") {
  const std::string file = "tests/data/pytorch/gpt/gpt_4layer_dp2.json";
  struct Layout {
    int dp, tp;
  };
  for (const Layout l : {Layout{1, 2}, Layout{2, 2}, Layout{1, 4}, Layout{2, 4}}) {
    for (const char* stage : {"0", "1", "2", "3"}) {
      for (bool sp : {false, true}) {
        CAPTURE(l.dp);
        CAPTURE(l.tp);
        CAPTURE(stage);
        CAPTURE(sp);
        std::vector<std::string> args = {"--file", file, "--stage", stage, "--tp", std::to_string(l.tp)};
        if (sp) args.push_back("--sequence-parallel");
        const auto r = testing::launch(l.dp * l.tp, "tests/gpt_reference_worker", args);
        INFO(r.output);
        CHECK(r.exit_code == 0);
        CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
      }
    }
  }
  // The 2-head file where its sizes allow: tp 2.
  for (const char* stage : {"1", "3"}) {
    const auto r = testing::launch(2, "tests/gpt_reference_worker",
                                   {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--stage", stage, "--tp", "2",
                                    "--sequence-parallel"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("check and 3 steps match PyTorch") != std::string::npos);
  }
  for (bool sp : {false, true}) {
    std::vector<std::string> args = {"--file", file, "--stage", "3", "--offload", "--tp", "2"};
    if (sp) args.push_back("--sequence-parallel");
    const auto r = testing::launch(4, "tests/gpt_reference_worker", args);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("dp 2 x tp 2") != std::string::npos);
  }
}

TEST_CASE("a reference whose heads tp does not divide fails naming both") {
  // gpt_tiny_dp2 has 2 heads.
  const auto r = testing::launch(4, "tests/gpt_reference_worker",
                                 {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--tp", "4"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("n_head 2 does not divide by tp 4") != std::string::npos);
  const auto s = testing::launch(1, "tests/gpt_reference_worker",
                                 {"--file", "tests/data/pytorch/gpt/gpt_tiny_dp2.json", "--sequence-parallel"});
  INFO(s.output);
  CHECK(s.exit_code != 0);
  CHECK(s.output.find("--sequence-parallel needs --tp above 1") != std::string::npos);
}

}  // namespace zero
