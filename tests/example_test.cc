// The README's main job: the example trains, its loss decreases, and in deterministic mode the loss
// curve is identical at stages 0, 1, 2 and 3, and with the optimizer (and parameters) offloaded. Also the memory benchmark's formula check at N = 2 and 4.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "testing/launch.h"

namespace zero {
namespace {

std::vector<std::string> loss_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find("] step ");
    if (p != std::string::npos) lines.push_back(line.substr(p + 2));
  }
  return lines;
}

double loss_of(const std::string& line) {
  const size_t p = line.find("loss ");
  REQUIRE(p != std::string::npos);
  return std::stod(line.substr(p + 5));
}

}  // namespace

TEST_CASE("example: loss decreases and is identical across stages and offload in deterministic mode") {
  std::vector<std::string> first;
  const std::vector<std::vector<std::string>> configs{{"--stage", "0"}, {"--stage", "1"}, {"--stage", "2"},
                                                      {"--stage", "3"}, {"--stage", "1", "--offload"},
                                                      {"--stage", "3", "--offload-params"}};
  for (const auto& config : configs) {
    CAPTURE(config.back());
    std::vector<std::string> args{"--steps", "30", "--deterministic", "--lr", "0.01", "--hidden", "64",
                                  "--bucket-kib", "16"};
    args.insert(args.end(), config.begin(), config.end());
    const auto r = testing::launch(2, "examples/train_mlp", args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto lines = loss_lines(r.output);
    REQUIRE(lines.size() == 30);
    double head = 0, tail = 0;  // mean of the first and the last five steps
    for (int i = 0; i < 5; ++i) {
      head += loss_of(lines[static_cast<size_t>(i)]) / 5;
      tail += loss_of(lines[lines.size() - 1 - static_cast<size_t>(i)]) / 5;
    }
    CHECK(tail < 0.8 * head);
    CHECK(r.output.find("measured/predicted") != std::string::npos);
    if (first.empty()) {
      first = lines;
    } else {
      CHECK(lines == first);
    }
  }
}

TEST_CASE("memory per rank within 5% of the ZeRO formulas, N = 2 and 4, with and without optimizer and parameter offload") {
  for (const char* n : {"2", "4"}) {
    for (const char* stage : {"0", "1", "2", "3"}) {
      for (bool offload : {false, true}) {
        CAPTURE(n);
        CAPTURE(stage);
        CAPTURE(offload);
        std::vector<std::string> args{"--stage", stage, "--params-m", "2", "--tensors", "8",
                                      "--bucket-m", "1", "--tolerance", "0.05"};
        if (offload) args.push_back("--offload");
        const auto r = testing::launch(std::stoi(n), "examples/memory_bench", args);
        INFO(r.output);
        CHECK(r.exit_code == 0);
        CHECK(r.output.find("measured/predicted") != std::string::npos);
        // Offloaded, the host tier is compared on its own line.
        CHECK((r.output.find("host formula") != std::string::npos) == offload);
      }
    }
    const auto r = testing::launch(std::stoi(n), "examples/memory_bench",
                                   {"--stage", "3", "--params-m", "2", "--tensors", "8", "--bucket-m", "1",
                                    "--tolerance", "0.05", "--offload-params"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("2Ψ/N; host 2Ψ/N + 12Ψ/N") != std::string::npos);
  }
}

}  // namespace zero
